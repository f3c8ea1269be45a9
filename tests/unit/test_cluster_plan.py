"""The pieces of `cyto score --ray` that need no cluster: where engines go, how a large slide is
cut into ranges of tiles, and addresses that are refused at once."""

from __future__ import annotations

import pytest

from cyto.cohort.parts import tile_ranges
from cyto.cohort.ray import Place, _check_reachable, engine_device, engine_places
from cyto.cohort.table import COHORT_COLUMNS, cohort_row
from cyto.errors import ConfigError

NODES = [
    {
        "Alive": True,
        "NodeID": "a" * 56,
        "NodeManagerAddress": "10.0.0.1",
        "Resources": {"CPU": 16.0, "GPU": 2.0},
    },
    {
        "Alive": True,
        "NodeID": "b" * 56,
        "NodeManagerAddress": "10.0.0.2",
        "Resources": {"CPU": 8.0},
    },
    {
        "Alive": False,
        "NodeID": "c" * 56,
        "NodeManagerAddress": "10.0.0.3",
        "Resources": {"CPU": 8.0, "GPU": 8.0},
    },
]


def test_one_engine_per_gpu_or_per_node_without_one_and_none_on_dead_nodes():
    assert engine_places(NODES, "auto") == [
        Place("a" * 56, "10.0.0.1", True),
        Place("a" * 56, "10.0.0.1", True),
        Place("b" * 56, "10.0.0.2", False),
    ]
    # the engine asked to run on the CPU: one per node, GPUs or not
    assert engine_places(NODES, "cpu") == [
        Place("a" * 56, "10.0.0.1", False),
        Place("b" * 56, "10.0.0.2", False),
    ]


@pytest.mark.parametrize("n,size", [(1, 1), (7, 3), (9, 3), (256, 256), (1000, 256)])
def test_tile_ranges_cover_every_tile_once_in_order(n, size):
    ranges = tile_ranges(n, size)
    tiles = [t for a, b in ranges for t in range(a, b)]
    assert tiles == list(range(n))
    assert all(0 < b - a <= size for a, b in ranges)


def test_tile_ranges_of_an_empty_slide_and_a_bad_size():
    assert tile_ranges(0, 8) == []
    with pytest.raises(ValueError):
        tile_ranges(5, 0)


@pytest.mark.parametrize("address", ["banana", "10.0.0.1", "host:port", ":6379"])
def test_a_malformed_address_is_one_line(address):
    with pytest.raises(ConfigError, match="HOST:PORT"):
        _check_reachable(address)


def test_nothing_listening_is_said_in_seconds():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(ConfigError, match="nothing answers there"):
            _check_reachable(f"127.0.0.1:{port}", timeout=2)


def test_cohort_rows_say_where_and_in_how_many_attempts():
    row = cohort_row("s.ndpi", "out/s", None, "boom", node="gpu7:abcd1234", attempts=2)
    assert set(row) == set(COHORT_COLUMNS)
    assert (row["node"], row["attempts"], row["status"]) == ("gpu7:abcd1234", 2, "failed")


def test_an_engine_on_a_gpu_uses_the_one_ray_gave_it():
    # Ray sets CUDA_VISIBLE_DEVICES to the actor's GPU: --device cuda:3 means that one, cuda:0
    assert engine_device("cuda:3", [3]) == "cuda"
    assert engine_device("auto", [1]) == "auto"
    assert engine_device("cuda:1", []) == "cuda:1"  # no GPU given: the user's choice stands
    assert engine_device("cpu", []) == "cpu"


def test_auto_starts_a_local_cluster_when_the_recorded_head_is_gone(tmp_path, monkeypatch):
    """A killed cluster leaves Ray's ray_current_cluster behind; --ray auto then failed with
    'cannot join a Ray cluster there'. Now a recorded head that does not answer means a new
    local cluster, said in words; one that answers is joined; RAY_ADDRESS comes first."""
    import socket

    from cyto.cohort.ray import auto_target, recorded_cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    record = recorded_cluster()
    assert record == tmp_path / "ray" / "ray_current_cluster"
    # no record: a new local cluster, which the run says it started (it said "joined")
    assert auto_target() == ("local", "")
    record.parent.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed when the block ends: nothing answers there
    record.write_text(f"127.0.0.1:{dead}")
    target, note = auto_target()
    assert target == "local" and f"127.0.0.1:{dead}" in note and "is gone" in note
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        record.write_text(f"127.0.0.1:{live.getsockname()[1]}")
        assert auto_target() == (None, "")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    record.write_text(f"127.0.0.1:{dead}")
    assert auto_target() == (None, "")
