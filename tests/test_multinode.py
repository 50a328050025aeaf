"""Past one node, on one machine: T-GRPO as two torchrun agents of one rank each (c10d rendezvous
on 127.0.0.1, as two hosts would start it) ends bit-identical to one agent of two ranks; a vLLM
tensor-parallel group never spans two nodes. SFT on two nodes, with a node lost and restarted, is
tests/test_restarts.py."""

import pytest
from test_restarts import agent, assert_same_run, cores, free_port, node_args, one_node
from test_restarts import program_args as driver_args
from test_train_tgrpo import tgrpo_sets

from psyrl.runtime.vllm_sampler import check_tensor_parallel


def test_a_tensor_parallel_group_stays_inside_a_node():
    check_tensor_parallel(2, 4, local_world=2)  # 2 nodes x 2 GPUs: one engine per node
    check_tensor_parallel(2, 2)  # one node: local_world defaults to the world
    with pytest.raises(ValueError, match="= 2 must divide the 1 ranks of a node"):
        check_tensor_parallel(2, 2, local_world=1)  # 2 nodes x 1 GPU: a group would cross
    with pytest.raises(ValueError, match="= 4 must divide the 2 ranks of a node"):
        check_tensor_parallel(4, 8, local_world=2)


@pytest.mark.slow
def test_tgrpo_on_two_nodes_equals_one_node_of_two_ranks(start, tmp_path):
    # 2 steps of 8 prompts x 4 samples, each rank sampling its share of the groups; the run
    # directory, metrics.jsonl and checkpoints written once, on the filesystem both "nodes" share
    extra = ("checkpoint.every=1", "checkpoint.keep_state=0")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    code, out, err = one_node(one, "tgrpo", tgrpo_sets(start, one, *extra))
    assert code == 0, out[-2000:] + err[-3000:]
    port, cpus = free_port(), cores(2)
    program = driver_args(two, "tgrpo", tgrpo_sets(start, two, *extra))
    nodes = [agent([*node_args(port, node, 0), *program], cpus[node]) for node in (0, 1)]
    said = [node.communicate(timeout=600) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [
        s[0][-2000:] + s[1][-3000:] for s in said
    ]
    assert "on 2 x cpu (FSDP2" in said[0][0] + said[1][0]
    assert_same_run(one / "rl", two / "rl")
    for step in (1, 2):
        path = f"checkpoints/step-{step}/trajectory_cache.json"
        assert (one / "rl" / path).read_text() == (two / "rl" / path).read_text()
