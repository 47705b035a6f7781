"""The package as a user installs it: every package folder is in the wheel, the wheel
installs away from the source tree, imports every example and runs ``driftstream plan``;
benchmark results stay out of it."""

from __future__ import annotations

import glob
import os
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("engine", "ordering", "snapshots", "barriers", "examples")


def _package_folders() -> set:
    return {"driftstream." + str(Path(p).parent).replace(os.sep, ".")
            for folder in FOLDERS for p in glob.glob(f"{folder}/**/__init__.py", root_dir=ROOT, recursive=True)}


def test_every_package_folder_is_in_pyprojects_package_list():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert _package_folders() - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - _package_folders() == set(), "pyproject.toml lists packages that have no folder"


@pytest.mark.slow
def test_the_wheel_installs_away_from_the_source_and_runs(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path / "dist")],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    (wheel,) = glob.glob(str(tmp_path / "dist" / "driftstream-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("driftstream/examples/nexmark/") for n in names)
    assert not [n for n in names if "/results/" in n or n.endswith((".svg", ".json"))], "results files belong to the repository, not the wheel"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # The dependencies come from this run's environment (a path line: its editable finder of
    # the source tree is not loaded); driftstream itself only from the wheel.
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", wheel], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr

    away = tmp_path / "elsewhere"
    away.mkdir()
    check = (
        "import importlib, pkgutil, driftstream.engine, driftstream.examples as ex\n"
        f"assert driftstream.engine.__file__.startswith({purelib!r}), driftstream.engine.__file__\n"
        "mods = [m.name for m in pkgutil.walk_packages(ex.__path__, 'driftstream.examples.')]\n"
        "[importlib.import_module(m) for m in mods]\n"
        "print(len(mods))\n"
    )
    imported = subprocess.run([str(python), "-c", check], cwd=away, capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr
    assert int(imported.stdout.strip()) > 30
    plan = subprocess.run([str(venv / "bin" / "driftstream"), "plan", "driftstream.examples.wordcount:flow", "-p", "2"],
                          cwd=away, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr
    assert "stage" in plan.stdout and "wordcount/" in plan.stdout
