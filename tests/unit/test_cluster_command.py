"""``harness cluster`` is the zmq plugin's command (a ``CommandSpec``), not a core command: the
real CLI lists it as the plugin's, builds its parser without importing pyzmq, and with the
plugin blocked says which plugin and extra bring it back. What the commands do is
tests/distributed/test_cluster.py's (unchanged by the move)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from harness.plugins import collect_registry, make_plugin_manager
from harness.registry import TransportSpec

CLI = [sys.executable, "-m", "harness.cli"]


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_cluster_is_registered_by_the_zmq_plugin_as_a_command() -> None:
    registry = collect_registry(make_plugin_manager())
    assert registry.commands.get("cluster").plugin == "zmq"
    assert registry.transports.get("zmq").cluster is None  # (the deprecated field)
    listing = harness("--help")
    assert listing.returncode == 0, listing.stderr
    words = " ".join(listing.stdout.split())  # (argparse wraps the help column)
    assert "cluster start, join, inspect or stop a distributed cluster (plugin zmq)" in words
    helped = harness("cluster", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: harness cluster ")
    for command in ("keys", "start", "join", "status", "stop"):
        assert f"    {command} " in helped.stdout, helped.stdout


def test_declaring_the_cluster_arguments_imports_no_pyzmq() -> None:
    """``harness --help`` builds every plugin command's parser: the cluster's must stay cheap
    and must work where the zmq extra is not installed."""
    code = (
        "import sys\nfrom harness.cli import main\n"
        "for argv in (['--help'], ['cluster', 'start', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit as exc:\n"
        "        assert exc.code == 0, exc.code\n"
        "print('pyzmq imported' if 'zmq' in sys.modules else 'no pyzmq', file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("no pyzmq"), proc.stderr[-2000:]


@pytest.mark.parametrize(
    "argv",
    [["-p", "no:zmq", "cluster", "status"], ["cluster", "-p", "no:zmq", "start", "--help"]],
    ids=["before", "after"],
)
def test_with_the_zmq_plugin_blocked_the_error_names_it_and_its_extra(argv: list[str]) -> None:
    proc = harness(*argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (error,) = proc.stderr.splitlines()
    assert error.startswith("harness: error: harness cluster is the 'zmq' plugin's command")
    assert "pip install 'harness[zmq]'" in error and "-p no:zmq" in error, error


def test_a_transport_declaring_cluster_commands_is_warned_about() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = TransportSpec("mine", connect=lambda *a, **k: None, cluster=lambda argv: 0)
    (warning,) = caught
    assert issubclass(warning.category, DeprecationWarning)
    assert "CommandSpec" in str(warning.message) and "'mine'" in str(warning.message)
    assert spec.name == "mine"  # (still a valid record: the field is ignored, not refused)
