"""Helpers shared by the test suites (no fixtures here: plain functions and classes)."""
