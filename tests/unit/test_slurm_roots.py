"""The pure parts of running Slurm from Debian roots (healer_dev.devstack.slurm_root, ADR 0014),
reading slurmrestd's log back (healer_dev.devstack.restd_log), and the slurmrestd answers the
driver reads as they are (healer.adapters.slurm.slurmrestd): table-driven, no I/O."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from healer.adapters.slurm import slurmrestd
from healer.errors import ConfigError, ForbiddenError, PermanentError
from healer_dev.devstack.restd_log import RestdRequest, parse_restd_log
from healer_dev.devstack.slurm_root import (
    DEFAULT_SWITCHES,
    SlurmVersion,
    runner_script,
    topology_yaml,
)


def test_versions_say_where_they_come_from_and_what_they_serve() -> None:
    assert [v.suite for v in SlurmVersion] == [None, "trixie", "sid"]
    assert SlurmVersion.V26_05.restd_versions[:2] == ("v0.0.45", "v0.0.44")
    assert [v.has_topology_str for v in SlurmVersion] == [False, False, True]
    assert SlurmVersion.parse("24.11") is SlurmVersion.V24_11
    with pytest.raises(ConfigError, match=r"unknown Slurm version '25\.11'"):
        SlurmVersion.parse("25.11")


def test_the_runner_chroots_in_a_private_mount_namespace_with_the_binds() -> None:
    script = runner_script(Path("/cache/root dir"), [Path("/tmp/work")])
    assert script.startswith("#!/bin/sh\n")
    assert "[ -e /.healer-slurm-root ] && exec \"$@\"" in script  # inside a root: run it
    assert "unshare --mount --propagation private" in script
    for d in ("proc", "dev", "sys"):
        assert f'mount --rbind /{d} "$R/{d}"' in script
    assert 'mount --bind /etc/hosts "$R/etc/hosts"' in script
    assert 'mount --bind /tmp/work "$R"/tmp/work' in script
    assert "'/cache/root dir'" in script  # quoted


def test_topology_yaml_is_one_default_tree_with_every_switch_declared() -> None:
    doc = yaml.safe_load(topology_yaml(DEFAULT_SWITCHES))
    assert len(doc) == 1
    topo = doc[0]
    assert (topo["topology"], topo["cluster_default"]) == ("default", True)
    names = {s["switch"] for s in topo["tree"]["switches"]}
    for parent, children in DEFAULT_SWITCHES.items():
        assert parent in names
        assert set(children) <= names  # a child switch has an entry of its own
    for spec in ("default:spine1:leaf3", "default:nvl-a", "default:s1:l1", "default:a",
                 "default:spine2:leaf7"):
        assert set(spec.split(":")[1:]) <= names
    with pytest.raises(ConfigError):
        topology_yaml({})


LOG = """\
[2026-11-28T04:40:34.927] operations_router: [127.0.0.1:41339(fd:9)] GET /slurm/v0.0.44/nodes/
[2026-11-28T04:40:34.927] rest_auth/jwt: slurm_rest_auth_p_authenticate: [127.0.0.1:41339(fd:9)] \
attempting token authentication pass through
[2026-11-28T04:40:34.970] operations_router: [127.0.0.1:41340(fd:10)] DELETE /slurm/v0.0.45/job/99
[2026-11-28T04:40:34.971] something else
[2026-11-28T04:40:34.972] rest_auth/jwt: slurm_rest_auth_p_authenticate: [127.0.0.1:41340(fd:10)] \
attempting user_name root token authentication pass through
slurmrestd: operations_router: [[localhost]:35286(fd:10)] POST /slurm/v0.0.42/node/gpu-1
"""


def test_the_restd_log_names_method_path_and_the_user_header() -> None:
    assert parse_restd_log(LOG) == [
        RestdRequest("2026-11-28T04:40:34.927", "GET", "/slurm/v0.0.44/nodes/", ""),
        RestdRequest("2026-11-28T04:40:34.970", "DELETE", "/slurm/v0.0.45/job/99", "root"),
        RestdRequest("", "POST", "/slurm/v0.0.42/node/gpu-1", ""),
    ]
    assert parse_restd_log("") == []


UNKNOWN_NODE = ('{"nodes": [], "errors": [{"description": "Failure to query node gpu-99", '
                '"error_number": 0, "error": "No error", "source": "_dump_nodes"}]}')
REFUSED = ('{"errors": [{"description": "Failure to query nodes", "error_number": 1007, '
           '"error": "Protocol authentication error"}]}')


def test_slurmrestd_answers_as_the_real_servers_give_them() -> None:
    # 24.11/26.05: an unknown node is HTTP 200 with errno 0; a read leaves it to the caller
    assert slurmrestd._check("GET x", 200, UNKNOWN_NODE, read=True)["nodes"] == []
    with pytest.raises(PermanentError, match="Failure to query node"):
        slurmrestd._check("POST x", 200, UNKNOWN_NODE)  # never a silent write
    # a refused token: HTTP 511, errno 1007
    assert slurmrestd._auth_suspect(511, REFUSED) == "rejected"
    with pytest.raises(ForbiddenError, match=r"511 from slurmrestd"):
        slurmrestd._check("GET x", 511, REFUSED)
