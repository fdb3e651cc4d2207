"""The tests' Spark workers import pyspark from the venv rather than Spark's zip
(tests/helpers/worker_site/sitecustomize.py), and only when the zip is that venv's own."""

import os
import subprocess
import sys

import pytest

from tests.helpers.spark_session import WORKER_SITE, spark_environment

pytestmark = pytest.mark.unit


def _path_of(python_path: list[str]) -> list[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(WORKER_SITE)] + python_path))
    out = subprocess.run([sys.executable, "-c", "import sys; print('\\n'.join(sys.path))"],
                         env=env, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def test_the_venvs_own_zips_go_after_the_venv():
    import pyspark

    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    zips = [os.path.join(lib, name) for name in sorted(os.listdir(lib)) if name.endswith(".zip")]
    assert any(z.endswith("pyspark.zip") for z in zips)
    path = _path_of(zips)
    site_packages = os.path.dirname(os.path.dirname(pyspark.__file__))
    assert all(path.index(z) > path.index(site_packages) for z in zips), path


def test_a_zip_of_another_installation_stays_first(tmp_path):
    other = tmp_path / "spark" / "python" / "lib" / "pyspark.zip"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"")
    path = _path_of([str(other)])
    assert path.index(str(other)) < min(i for i, p in enumerate(path) if "site-packages" in p)


def test_the_worker_site_goes_first_once():
    env = spark_environment({"PYTHONPATH": "/a"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(WORKER_SITE), "/a"]
    assert spark_environment(env)["PYTHONPATH"] == env["PYTHONPATH"]
