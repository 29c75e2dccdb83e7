"""Pure parsing of Slurm output (healer.adapters.slurm.parse): odd lines, old and new JSON."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healer.adapters.slurm.parse import (
    SEP,
    expand_hostlist,
    parse_job_json,
    parse_kv_line,
    parse_node_json,
    parse_node_line,
    parse_nodes,
    parse_squeue,
    parse_state,
    scontrol_error_kind,
)
from healer.adapters.slurm.scontrol import normalize_signal

# A real `scontrol show node gpu-1 -o` line from Slurm 22.05.8 (note the double blanks, the
# `#` and `@` inside OS=, `=` inside CfgTRES= and an empty AllocTRES=).
REAL = (
    "NodeName=gpu-1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=1.51 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8 NodeAddr=127.0.0.1 "
    "NodeHostName=gpu-1 Port=36397 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=23223 Sockets=2 Boards=1 "
    "State=MIXED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu  BootTime=2026-11-21T23:59:23 SlurmdStartTime=2026-11-22T00:42:13 "
    "LastBusyTime=2026-11-22T00:42:13 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= "
    "CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s Reason=healer: XID 79 on GPU 3 (incident inc-7f3a) "
    "[root@2026-11-22T00:42:16]"
)


def test_a_real_22_05_line() -> None:
    kv = parse_kv_line(REAL)
    assert kv["OS"] == "Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0"
    assert kv["CfgTRES"] == "cpu=2,mem=1000M,billing=2"
    assert kv["AllocTRES"] == ""
    assert kv["Partitions"] == "gpu"
    assert kv["ReasonTime"] == "2026-11-22T00:42:16"
    st_ = parse_node_line(REAL)
    assert st_.name == "gpu-1"
    assert (st_.base, st_.flags) == ("MIXED", frozenset({"DRAIN"}))
    assert st_.reason == "healer: XID 79 on GPU 3 (incident inc-7f3a)"
    assert st_.reason_user == "root"
    assert st_.reason_is_ours
    assert st_.drain
    assert st_.busy
    assert not st_.drained
    assert st_.registered


@pytest.mark.parametrize(("line", "base", "flags", "reason", "user"), [
    # drained, reason with `Key=value`, brackets and many blanks; another field after it
    ("NodeName=gpu-0 State=IDLE+DRAIN Reason=disk  Key=val [x] swap  [slurm@2026-01-02T03:04:05]"
     " Comment=(null)", "IDLE", {"DRAIN"}, "disk  Key=val [x] swap", "slurm"),
    # no [user@time] suffix: the reason ends at the next Key=
    ("NodeName=gpu-0 Reason=maintenance window State=DOWN+DRAIN Weight=1",
     "DOWN", {"DRAIN"}, "maintenance window", ""),
    # tabs, leading/trailing blanks, lower case, sinfo-style suffix
    ("\t NodeName=gpu-2\tState=idle*   Weight=1  ", "IDLE", {"NOT_RESPONDING"}, "", ""),
    # no State at all
    ("NodeName=gpu-3 Arch=x86_64", "UNKNOWN", set(), "", ""),
    # empty reason text
    ("NodeName=gpu-3 State=DOWN+NOT_RESPONDING Reason= [root@2026-01-01T00:00:00]",
     "DOWN", {"NOT_RESPONDING"}, "", "root"),
    ("NodeName=gpu-3 State=ALLOCATED+COMPLETING+DRAIN Reason=Not responding "
     "[slurm@2026-01-01T00:00:00]", "ALLOCATED", {"COMPLETING", "DRAIN"}, "Not responding",
     "slurm"),
    ("NodeName=gpu-3 State=IDLE+CLOUD+POWERED_DOWN", "IDLE", {"CLOUD", "POWERED_DOWN"}, "", ""),
])
def test_odd_lines(line: str, base: str, flags: set[str], reason: str, user: str) -> None:
    node = parse_node_line(line)
    assert node.base == base
    assert node.flags == frozenset(flags)
    assert node.reason == reason
    assert node.reason_user == user


def test_derived_properties() -> None:
    drained = parse_node_line("NodeName=a State=IDLE+DRAIN Reason=x [root@t]")
    assert drained.drained
    assert not drained.reason_is_ours
    completing = parse_node_line("NodeName=a State=IDLE+DRAIN+COMPLETING")
    assert completing.busy
    assert not completing.drained
    gone = parse_node_line("NodeName=a State=DOWN+DRAIN+NOT_RESPONDING")
    assert gone.down
    assert not gone.registered
    assert gone.drained
    future = parse_node_line("NodeName=a State=FUTURE")
    assert not future.registered


def test_a_line_without_a_node_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="NodeName"):
        parse_node_line("No nodes in the system")
    assert parse_nodes(f"\n{REAL}\n\nNodeName=gpu-9 State=IDLE\n")[1].name == "gpu-9"


@pytest.mark.parametrize(("raw", "base", "flags"), [
    ("MIXED+DRAIN", "MIXED", {"DRAIN"}),
    ("drained", "IDLE", {"DRAIN"}),
    ("draining", "ALLOCATED", {"DRAIN"}),
    ("drng*", "ALLOCATED", {"DRAIN", "NOT_RESPONDING"}),
    ("mix", "MIXED", set()),
    ("idle~", "IDLE", {"POWERED_DOWN"}),
    ("down*", "DOWN", {"NOT_RESPONDING"}),
    ("", "UNKNOWN", set()),
    (["IDLE", "DRAIN"], "IDLE", {"DRAIN"}),
    (["DRAIN", "MIXED"], "MIXED", {"DRAIN"}),  # base first or not
    (["RESERVED", "PLANNED"], "UNKNOWN", {"RESERVED", "PLANNED"}),
])
def test_states(raw: str | list[str], base: str, flags: set[str]) -> None:
    assert parse_state(raw) == (base, frozenset(flags))


@pytest.mark.parametrize(("hostlist", "names"), [
    ("gpu-1", ("gpu-1",)),
    ("gpu-[0-2,5],cpu-1", ("gpu-0", "gpu-1", "gpu-2", "gpu-5", "cpu-1")),
    ("n[08-10]", ("n08", "n09", "n10")),
    ("rack[1-2]-gpu[0-1]", ("rack1-gpu0", "rack1-gpu1", "rack2-gpu0", "rack2-gpu1")),
    ("", ()),
    ("(null)", ()),
    ("None assigned", ()),
])
def test_hostlists(hostlist: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(hostlist) == names


def test_squeue_fields_keep_pipes_and_blanks_in_free_text() -> None:
    out = "\n".join([
        SEP.join(["12", "RUNNING", "gpu-1", "1", "train | big", "ckpt: every 10m | x"]),
        SEP.join(["13", "COMPLETING", "gpu-[1-2]", "0", "two nodes", "(null)"]),
        "garbage line",
        "",
    ])
    jobs = parse_squeue(out)
    assert [(j.id, j.state, j.nodes, j.requeue) for j in jobs] == [
        (12, "RUNNING", ("gpu-1",), True), (13, "COMPLETING", ("gpu-1", "gpu-2"), False)]
    assert jobs[0].name == "train | big"
    assert jobs[0].comment == "ckpt: every 10m | x"
    assert jobs[1].comment == ""


def test_rest_node_json_v0_0_38_and_v0_0_44() -> None:
    old = parse_node_json({"name": "gpu-1", "state": "mixed", "state_flags": ["DRAIN"],
                           "reason": "healer: x", "reason_set_by_user": "root"})
    new = parse_node_json({"name": "gpu-1", "state": ["MIXED", "DRAIN"], "reason": "healer: x",
                           "reason_set_by_user": "root",
                           "reason_changed_at": {"set": True, "infinite": False, "number": 1}})
    assert old == new
    assert old.drain
    assert old.busy
    bare = parse_node_json({"name": "gpu-2", "state": "idle", "state_flags": [], "reason": "",
                            "reason_set_by_user": None})
    assert (bare.base, bare.flags, bare.reason_user) == ("IDLE", frozenset(), "")
    with pytest.raises(ValueError, match="name"):
        parse_node_json({"state": ["IDLE"]})


def test_rest_job_json_old_and_new() -> None:
    old = parse_job_json({"job_id": 5, "job_state": "RUNNING", "nodes": "gpu-[1-2]",
                          "name": "a", "comment": "", "requeue": True})
    new = parse_job_json({"job_id": {"set": True, "number": 5}, "job_state": ["RUNNING"],
                          "nodes": "gpu-[1-2]", "name": "a", "comment": "", "requeue": True})
    assert old == new
    assert old.nodes == ("gpu-1", "gpu-2")
    with pytest.raises(ValueError, match="job_id"):
        parse_job_json({"job_state": "RUNNING"})


@pytest.mark.parametrize(("text", "kind"), [
    ("slurm_load_node error: Unable to contact slurm controller (connect failure)", "transient"),
    ("slurm_update error: Socket timed out on send/recv operation", "transient"),
    ("slurm_update error: Invalid node name specified", "not_found"),
    ("Node gpu-9 not found", "not_found"),
    ("squeue: error: Invalid node name gpu-9", "not_found"),
    ("scancel: error: Kill job error on job id 9: Invalid job id specified", "permanent"),
    ("slurm_update error: Access/permission denied", "permanent"),
    ("something new", ""),
])
def test_error_kinds(text: str, kind: str) -> None:
    assert scontrol_error_kind(text) == kind


def test_signals() -> None:
    assert normalize_signal("SIGUSR1") == "USR1"
    assert normalize_signal(" usr2 ") == "USR2"
    assert normalize_signal("10") == "10"
    for bad in ("", "USR1;reboot", "--full", "SIG"):
        with pytest.raises(ValueError, match="signal"):
            normalize_signal(bad)


_REASON_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="[]\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\u2028\u2029",
                           blacklist_categories=("Cs", "Cc", "Zl", "Zp")),
    min_size=1, max_size=60).map(str.strip).filter(bool).filter(
        lambda r: r not in ("None", "(null)"))  # how scontrol spells "no reason": not text


@given(reason=_REASON_TEXT, after=st.sampled_from(["", " Comment=(null)", "  Extra=x=1"]))
def test_any_reason_text_survives(reason: str, after: str) -> None:
    line = f"NodeName=n1 State=IDLE+DRAIN Reason={reason} [root@2026-01-01T00:00:00]{after}"
    node = parse_node_line(line)
    assert node.reason == reason
    assert node.reason_user == "root"
    assert node.drained


@pytest.mark.parametrize(("given", "when"), [
    ({"reason_changed_at": 1764108674}, "2025-11-25T22:11:14Z"),
    ({"reason_changed_at": {"set": True, "infinite": False, "number": 1764108674}},
     "2025-11-25T22:11:14Z"),
    ({"reason_changed_at": {"set": False, "number": 1764108674}}, ""),
    ({"reason_changed_at": 0}, ""),
    ({"reason_changed_at": True}, ""),
    ({"reason_changed_at": "yesterday"}, ""),
    ({"reason_changed_at": 1e300}, ""),
    ({}, ""),
])
def test_when_the_reason_was_set_rest(given: dict[str, object], when: str) -> None:
    node = parse_node_json({"name": "n", "state": ["IDLE", "DRAIN"], "reason": "NHC: x",
                            **given})
    assert node.reason_time == when


def test_when_the_reason_was_set_scontrol() -> None:
    assert parse_node_line(REAL).reason_time == "2026-11-22T00:42:16"
    assert parse_node_line("NodeName=a State=IDLE+DRAIN Reason=x").reason_time == ""
    # no reason, no time (Slurm prints the suffix alone after an emptied reason)
    empty = "NodeName=gpu-3 State=DOWN Reason= [root@2026-01-01T00:00:00]"
    assert parse_node_line(empty).reason_time == ""
