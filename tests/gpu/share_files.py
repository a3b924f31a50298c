"""The result files of the sharing scripts (share_group.sh, share_train_eval.sh, share_jax.sh),
read the same way by each: a file that is missing or not JSON belongs to a process that did not
finish, and reads as None."""
import json


def load_json(path):
    """The JSON value in `path`, or None."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def nvml_peak_gib(path):
    """The largest peak above idle that nvml_peak wrote to `path`, in GiB, or None."""
    try:
        devices = load_json(path)["devices"]
        return max(d["peak_delta"] for d in devices) / 2**30 if devices else None
    except (TypeError, KeyError, ValueError):
        return None


def top_external_gib(path):
    """The most memory any process created itself (cuMemCreate) in `cudapool top --json` output
    written to `path`, in GiB; 0 when there is none or the file is unreadable."""
    try:
        top = load_json(path)
        return max((d["external_bytes"] for p in top["processes"] for d in p["devices"]), default=0) / 2**30
    except (TypeError, KeyError):
        return 0.0
