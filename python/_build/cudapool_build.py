"""A PEP 517 build backend for the cudapool package, in the source tree itself.

The package is a few Python files and one C++ source (compiled at run time by
cudapool.torch.use(), never here), so a wheel is a zip of them with its metadata. Nothing is
downloaded: `pip install ./python` works offline, with or without build isolation.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "cudapool"
_TAG = "py3-none-any"


def _keys():
    """The [project] keys of pyproject.toml whose values are plain strings (the few used)."""
    with open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("[project]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^(\w[\w-]*)\s*=\s*"([^"]*)"', section, re.M))


def _project():
    """name, version, summary and requires-python from pyproject.toml."""
    keys = _keys()
    return keys["name"], keys["version"], keys.get("description", ""), keys.get("requires-python", "")


def _license_file():
    """The license text: LICENSE beside pyproject.toml, else at the repository's root; None when
    neither is there (a copy of python/ alone)."""
    for path in (os.path.join(_ROOT, "LICENSE"), os.path.join(os.path.dirname(_ROOT), "LICENSE")):
        if os.path.isfile(path):
            return path
    return None


def _files():
    """(path in the wheel, path on disk) of the package's files, sorted."""
    out = []
    pkg = os.path.join(_ROOT, _PACKAGE)
    for name in sorted(os.listdir(pkg)):
        if name.endswith((".py", ".cpp")):
            out.append((f"{_PACKAGE}/{name}", os.path.join(pkg, name)))
    return out


def _metadata():
    name, version, summary, requires = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}"]
    if requires:
        lines.append(f"Requires-Python: {requires}")
    license = _keys().get("license", "")
    if license:
        lines.append(f"License: {license}")
    if license == "Apache-2.0":
        lines.append("Classifier: License :: OSI Approved :: Apache Software License")
    readme = os.path.join(_ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    return ("\n".join(lines) + "\n" + body).encode("utf-8")


def _dist_info():
    name, version, _, _ = _project()
    return f"{name}-{version}.dist-info", f"{name}-{version}"


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info, _ = _dist_info()
    d = os.path.join(metadata_directory, info)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "wb") as f:
        f.write(_metadata())
    with open(os.path.join(d, "WHEEL"), "wb") as f:
        f.write(_wheel_file())
    return info


def _wheel_file():
    return f"Wheel-Version: 1.0\nGenerator: cudapool_build\nRoot-Is-Purelib: true\nTag: {_TAG}\n".encode()


def _write_wheel(wheel_directory, entries):
    info, stem = _dist_info()
    path = os.path.join(wheel_directory, f"{stem}-{_TAG}.whl")
    records = []
    extra = [(f"{info}/METADATA", _metadata()), (f"{info}/WHEEL", _wheel_file())]
    if _license_file():
        with open(_license_file(), "rb") as f:
            extra.append((f"{info}/LICENSE", f.read()))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries + extra:
            z.writestr(zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0)), data)
            records.append(_record_line(arc, data))
        records.append(f"{info}/RECORD,,")
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0)), "\n".join(records) + "\n")
    return os.path.basename(path)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for arc, disk in _files():
        with open(disk, "rb") as f:
            entries.append((arc, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file that puts the source tree on sys.path.
    return _write_wheel(wheel_directory, [(f"_{_PACKAGE}_editable.pth", (_ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    _, stem = _dist_info()
    path = os.path.join(sdist_directory, f"{stem}.tar.gz")
    with tarfile.open(path, "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/cudapool_build.py"] + [a for a, _ in _files()]:
            disk = os.path.join(_ROOT, rel)
            if os.path.exists(disk):
                t.add(disk, arcname=f"{stem}/{rel}")
        if _license_file():
            t.add(_license_file(), arcname=f"{stem}/LICENSE")
        info = tarfile.TarInfo(f"{stem}/PKG-INFO")
        data = _metadata()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return os.path.basename(path)
