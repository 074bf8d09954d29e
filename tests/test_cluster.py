"""flowrl.utils.cluster's checks without a launch: SLURM's host-list grammar (well-formed lists expand to their hosts,
malformed ones are refused naming the variable), the ports a launch needs, the checked reader of the process
variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and the join check's comparison of what nodes bring."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.utils.cluster import ClusterError, disagreement, expand_hosts, first_host, process_rank, resolve

NONE = {"nnodes": None, "node_rank": None, "nproc_per_node": None, "master_addr": None, "master_port": None}


# --- SLURM host lists -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("nodelist", "hosts"), [
    ("node12", ["node12"]),
    ("gpu[07-09,12]", ["gpu07", "gpu08", "gpu09", "gpu12"]),
    ("a,b[1-2]", ["a", "b1", "b2"]),
    ("x[003]", ["x003"]),
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("n[8-10]", ["n8", "n9", "n10"]),  # no padding in the start: none added
    ("n[08-10]", ["n08", "n09", "n10"]),  # the start's width kept
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("n[1-2].ib,login-1.example_org", ["n1.ib", "n2.ib", "login-1.example_org"]),
    (" gpu[1-2]\n", ["gpu1", "gpu2"]),  # the value's outer blanks are not part of it
])
def test_well_formed_host_lists_expand_to_their_hosts(nodelist: str, hosts: list[str]) -> None:
    assert list(expand_hosts(nodelist)) == hosts
    assert first_host(nodelist) == hosts[0]


def test_the_first_host_of_a_huge_range_is_read_without_expanding_it() -> None:
    assert first_host("n[1-999999999999],m") == "n1"


MALFORMED = ["node[1-3", "node[]", "node1 node2", "node[1-3] ", "node[3-1]", "a,,b", ",a", "a,", "node]", "node[1-3]]",
             "node[[1]]", "node[a-b]", "node[1-]", "node[-3]", "node[1,]", "node[,1]", "node[1--3]", "node[1-2-3]",
             "no\tde", "node;x", "node[1-2]x[", "nöde", "node[1 -2]", "[", "]", "[]"]


@pytest.mark.parametrize("nodelist", MALFORMED)
def test_malformed_host_lists_are_refused(nodelist: str) -> None:
    if nodelist == "node[1-3] ":  # an outer blank is dropped: well-formed
        assert first_host(nodelist) == "node1"
        return
    with pytest.raises(ValueError, match="not a SLURM host list"):
        first_host(nodelist)
    with pytest.raises(ClusterError) as caught:
        resolve(NONE, {"SLURM_JOB_NODELIST": nodelist}, gpus=0)
    message = str(caught.value)
    assert message.startswith(f"SLURM_JOB_NODELIST={nodelist!r}: not a SLURM host list") and "\n" not in message


LITERAL = st.text(alphabet="abcxyz019.-_", min_size=0, max_size=4)
# one item of a bracket: (start, how many more, zero padding added to the start, the end written padded)
ITEM = st.tuples(st.integers(0, 120), st.integers(0, 3), st.integers(0, 2), st.booleans())
GROUP = st.lists(ITEM, min_size=1, max_size=3)
HOST = st.tuples(st.text(alphabet="abcxyz019.-_", min_size=1, max_size=4), st.lists(st.tuples(GROUP, LITERAL),
                                                                                         max_size=2))
HOSTS = st.lists(HOST, min_size=1, max_size=3)


def render(hosts: list[tuple[str, list[tuple[list[tuple[int, int, int, bool]], str]]]]) -> tuple[str, list[str]]:
    """The text of a host list built from its parts, and the hosts it names (each range counted out here)."""
    texts, names = [], []
    for prefix, groups in hosts:
        text, choices = prefix, [[prefix]]
        for items, literal in groups:
            written, numbers = [], []
            for start, more, pad, pad_end in items:
                width = len(str(start)) + pad
                first = str(start).zfill(width)
                end = str(start + more).zfill(width) if pad_end else str(start + more)
                written.append(first if more == 0 and pad_end else f"{first}-{end}")
                numbers.extend(str(n).zfill(width) for n in range(start, start + more + 1))
            text += "[" + ",".join(written) + "]" + literal
            choices += [numbers, [literal]]
        texts.append(text)
        names.extend("".join(parts) for parts in itertools.product(*choices))
    return ",".join(texts), names


@settings(max_examples=300, deadline=None)
@given(HOSTS)
def test_any_well_formed_host_list_expands_to_the_hosts_it_names(hosts: list) -> None:  # type: ignore[type-arg]
    text, names = render(hosts)
    assert list(expand_hosts(text)) == names
    assert first_host(text) == names[0]
    assert resolve(NONE, {"SLURM_NODELIST": text}, gpus=0).master_addr == names[0]


@settings(max_examples=300, deadline=None)
@given(HOSTS, st.integers(0, 10_000), st.sampled_from(["drop a bracket", "a blank inside", "an empty bracket",
                                                        "a reversed range", "an empty host"]))
def test_any_damaged_host_list_is_refused(hosts: list, where: int, damage: str) -> None:  # type: ignore[type-arg]
    text, _ = render(hosts)
    brackets = [i for i, c in enumerate(text) if c in "[]"]
    if damage == "drop a bracket" and brackets:
        i = brackets[where % len(brackets)]
        text = text[:i] + text[i + 1:]
    elif damage == "a blank inside" and len(text) > 1:
        i = 1 + where % (len(text) - 1)
        text = text[:i] + " " + text[i:]
    elif damage == "an empty bracket":
        text += "[]"
    elif damage == "a reversed range":
        text += f",r[{where + 1}-{where}]"
    else:
        text = text + "," if where % 2 else "," + text
    with pytest.raises(ValueError, match="not a SLURM host list"):
        first_host(text)


@pytest.mark.parametrize("variable", ["MASTER_ADDR", "MAIN_PROCESS_IP"])
def test_a_main_address_with_a_blank_inside_is_refused(variable: str) -> None:
    with pytest.raises(ClusterError, match=rf"^{variable}='node1 node2': expected one host name or address"):
        resolve(NONE, {variable: "node1 node2"}, gpus=0)
    assert resolve(NONE, {variable: " 10.0.0.5\n"}, gpus=0).master_addr == "10.0.0.5"


# --- ports ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variable", ["MASTER_PORT", "MAIN_PROCESS_PORT"])
def test_a_port_without_a_port_above_it_is_refused_naming_the_variable(variable: str) -> None:
    with pytest.raises(ClusterError, match=rf"^{variable}='65535': expected a port from 1 to 65534 \(the join check"
                                           r" listens on the port above it\)$"):
        resolve(NONE, {variable: "65535"}, gpus=0)
    assert resolve(NONE, {variable: "65534"}, gpus=0).master_port == 65534
    with pytest.raises(ClusterError, match=rf"^{variable}='0': expected a port from 1 to 65534"):
        resolve(NONE, {variable: "0"}, gpus=0)


# --- the process variables --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("env", "expected"), [
    ({}, (0, 1)),
    ({"RANK": "3", "WORLD_SIZE": "4"}, (3, 4)),
    ({"RANK": " 0 ", "WORLD_SIZE": "1"}, (0, 1)),
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, (5, 8)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, (1, 2)),
])
def test_the_process_variables_give_rank_and_world_size(env: dict[str, str], expected: tuple[int, int]) -> None:
    assert process_rank(env) == expected


@pytest.mark.parametrize(("env", "message"), [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc': expected a whole number of processes, at least 1"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0': expected a whole number of processes, at least 1"),
    ({"WORLD_SIZE": "-2"}, "WORLD_SIZE='-2': expected a whole number of processes, at least 1"),
    ({"WORLD_SIZE": "1.0"}, "WORLD_SIZE='1.0': expected a whole number of processes, at least 1"),
    ({"WORLD_SIZE": "1_0"}, "WORLD_SIZE='1_0': expected a whole number of processes, at least 1"),
    ({"WORLD_SIZE": ""}, "WORLD_SIZE='': expected a whole number of processes, at least 1"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK='5': expected a whole number from 0 to 1 (WORLD_SIZE='2')"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1': expected a whole number from 0 to 1 (WORLD_SIZE='2')"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one': expected a whole number from 0 to 1 (WORLD_SIZE='2')"),
    ({"RANK": "1"}, "RANK='1': expected a whole number from 0 to 0 (WORLD_SIZE unset: one process)"),
    ({"WORLD_SIZE": "2"},
     "RANK is unset but WORLD_SIZE='2': a launcher sets both (flowrl launch, torchrun, accelerate)"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "0"},
     "LOCAL_WORLD_SIZE='0': expected a whole number from 1 to 2 (WORLD_SIZE='2')"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"},
     "LOCAL_WORLD_SIZE='3': expected a whole number from 1 to 2 (WORLD_SIZE='2')"),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
     "LOCAL_RANK='2': expected a whole number from 0 to 1 (LOCAL_WORLD_SIZE='2')"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "x"},
     "LOCAL_RANK='x': expected a whole number from 0 to 1 (WORLD_SIZE='2')"),
])
def test_malformed_process_variables_are_refused_naming_them(env: dict[str, str], message: str) -> None:
    with pytest.raises(ClusterError, match="^" + re.escape(message) + "$"):
        process_rank(env)


@given(st.integers(1, 64), st.integers(-3, 70), st.integers(-1, 70))
def test_every_rank_in_range_is_read_and_every_other_refused(world: int, rank: int, local: int) -> None:
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "LOCAL_RANK": str(local)}
    if 0 <= rank < world and 0 <= local < world:
        assert process_rank(env) == (rank, world)
    else:
        with pytest.raises(ClusterError, match="RANK="):
            process_rank(env)


# --- what the nodes bring to the join check ---------------------------------------------------------------------

def node(rank: int, **changes: object) -> dict[str, object]:
    facts: dict[str, object] = {"node_rank": rank, "host": f"h{rank}", "nnodes": 2, "nproc_per_node": 1,
                                "master_port": 29500, "command": "train r.toml", "flowrl": "0.1.0",
                                "torch": "2.13.0", "device": "cpu",
                                "source": {"nnodes": "--nnodes", "nproc_per_node": "NPROC_PER_NODE"}}
    return {**facts, **changes}


def test_nodes_that_agree_pass_and_a_partial_join_waits() -> None:
    assert disagreement([node(0), node(1)], nnodes=2) is None
    assert disagreement([node(1)], nnodes=2) is None  # the others have not joined yet
    assert disagreement([node(1), node(0, host="elsewhere")], nnodes=2) is None  # hosts may differ


@pytest.mark.parametrize(("changes", "message"), [
    ({"nproc_per_node": 2}, "the nodes disagree: nproc_per_node = 1 on node 0 (host h0, NPROC_PER_NODE) but 2 on"
                            " node 1 (host h1, NPROC_PER_NODE)"),
    ({"nnodes": 3}, "the nodes disagree: nnodes = 2 on node 0 (host h0, --nnodes) but 3 on node 1 (host h1,"
                    " --nnodes)"),
    ({"command": "train other.toml"}, "the nodes disagree: command = 'train r.toml' on node 0 (host h0) but"
                                      " 'train other.toml' on node 1 (host h1)"),
    ({"master_port": 29600}, "the nodes disagree: master_port = 29500 on node 0 (host h0, default) but 29600 on"
                             " node 1 (host h1, default)"),
    ({"flowrl": "0.2.0"}, "the nodes disagree: flowrl = '0.1.0' on node 0 (host h0) but '0.2.0' on node 1"),
    ({"device": "cuda"}, "the nodes disagree: device = 'cpu' on node 0 (host h0) but 'cuda' on node 1"),
    ({"node_rank": 0}, "node rank 0 is given by two nodes (host h0 and host h1)"),
])
def test_nodes_that_disagree_are_named_with_what_each_said(changes: dict[str, object], message: str) -> None:
    found = disagreement([node(0), node(1, **changes)], nnodes=2)
    assert found is not None and found.startswith(message), found
    assert "\n" not in found


def test_more_nodes_than_nnodes_are_refused() -> None:
    found = disagreement([node(0), node(1), node(1, host="h2")], nnodes=2)
    assert found is not None and found.startswith("3 nodes joined but nnodes = 2"), found


def test_hybrid_sharding_reads_the_node_size_through_the_checked_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.trainer.sharding import shard_group

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert shard_group(True, 4) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ClusterError, match=r"^LOCAL_WORLD_SIZE='two': expected a whole number from 1 to 4"):
        shard_group(True, 4)
