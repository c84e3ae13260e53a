"""Checkpoints across versions (gradzip.checkpoint): every door's state_dict() carries its
format; this build loads the golden files of every format earlier builds wrote and its
resumed step gives their outputs bit for bit; a newer or damaged format is refused with
an error that names it."""
from pathlib import Path

import pytest
import torch

from checkpoint_scenarios import FORMAT_0_DOORS, SPECS, scenario
from ranks import run_ranks

GOLDEN = Path(__file__).resolve().parent / "checkpoints"
# Written by the builds that shipped each format (checkpoints/README.md).
BEFORE_3 = tuple(door for door in SPECS if door != "fsdp_layers")  # FSDP's layers came with format 3
SETS = {"format0": FORMAT_0_DOORS, "format1-unstamped": BEFORE_3, "format1": BEFORE_3, "format2": BEFORE_3,
        "format3": tuple(SPECS)}
STAMPED = {"format1": 1, "format2": 2, "format3": 3}
# Doors whose step runs torch's matmuls on FSDP2's unsharded parameters: their last bits
# depend on the CPU that runs them (on an AVX-512 Xeon, MKL's and ATen's kernels give step
# 2's gradients 5e-8 to 1.2e-7 of their largest off the AVX2 machine's that wrote the golden
# files, and MKL_CBWR=AVX2 with ATEN_CPU_CAPABILITY=avx2 takes back all but fsdp_layers). Their
# resumed step is compared to within 1e-5 of its largest element: a lost residual moves it
# by all of that (1.0), so the check still sees any state gradzip mislays. The other doors'
# steps are bit for bit on every CPU seen.
CPU_DEPENDENT = ("fsdp", "fsdp_layers")


def golden(name, door):
    return torch.load(GOLDEN / name / f"{door}.pt", weights_only=False)


@pytest.mark.parametrize("name,door", [(name, door) for name, doors in SETS.items() for door in doors])
def test_a_golden_checkpoint_resumes_as_its_writer_did(name, door):
    import gradzip
    saved = golden(name, door)
    # A hook with the model of formats 0 and 1, and FSDP before format 3, read as layers=off,
    # the default they ran under.
    if door.startswith("hook"):
        reads_as = gradzip.checkpoint.hook_state(saved["checkpoints"][0]["hook"])["spec"]
    elif door.startswith("fsdp"):
        reads_as = gradzip.checkpoint.fsdp_state(saved["checkpoints"][0]["fsdp"])["spec"]
    else:
        reads_as = saved["spec"]
    assert reads_as == SPECS[door] and saved["world_size"] == 2
    if name in STAMPED:
        stamps = [c["fsdp"] if door.startswith("fsdp") else c["diloco"] if door == "diloco" else
                  c["hook"] if door.startswith("hook") else c for c in saved["checkpoints"]]
        assert all(s["format"] == STAMPED[name] for s in stamps)
    resumed = run_ranks(_resume, 2, door, saved["checkpoints"])
    for rank, (mine, theirs) in enumerate(zip(resumed, saved["outputs"])):
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            if door in CPU_DEPENDENT:
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * float(b.abs().max()),
                                           msg=lambda m: f"{name} {door} rank {rank}: {m}")
            else:
                assert torch.equal(a, b), (name, door, rank, (a - b).abs().max())


def _resume(rank, world_size, door, checkpoints):
    return scenario(rank, world_size, door, checkpoints[rank])["outputs"]


def test_the_golden_files_are_this_builds_format():
    """What this build writes today is what the newest folder holds (the same scenario, run now)."""
    import gradzip
    now = run_ranks(scenario, 2, "aggregation")
    saved = golden("format3", "aggregation")
    for mine, theirs in zip(now, saved["checkpoints"]):
        assert mine["checkpoint"]["format"] == gradzip.checkpoint.FORMAT == theirs["format"]
        assert sorted(mine["checkpoint"]["tensors"]) == sorted(theirs["tensors"])
        assert all(torch.equal(mine["checkpoint"]["tensors"][k], v) for k, v in theirs["tensors"].items())


def test_format_0_migrates_to_named_tensors():
    import gradzip.checkpoint as checkpoint
    saved = golden("format0", "hook_model")["checkpoints"][0]["hook"]
    state = checkpoint.hook_state(saved)
    residuals = {k for k in state["state"] if k.endswith("/residual")}
    assert residuals == {f"{name}/residual" for name in saved["parameters"]}
    calls = saved["iteration"] - saved["start_iter"]
    assert all(int(v) == calls for k, v in state["state"].items() if k.endswith("/calls"))
    old = golden("format0", "aggregation")["checkpoints"][0]
    state = checkpoint.aggregation_state(old)
    assert torch.equal(state["tensors"]["tensor/residual"], old["tensors"]["tensor"]["residual"].flatten())
    assert int(state["tensors"]["tensor/step"]) == old["tensors"]["tensor"]["step"]


@pytest.mark.parametrize("name", ["format0", "format1"])
def test_a_hook_with_the_model_before_format_2_reads_as_layers_off(name):
    """Formats 0 and 1 ran the hook with layers=off by default: with model= their spec
    reads as layers=off, and a State of the bare spec (layers=auto now) refuses them by
    name; without model= the spec stays (layers does nothing there)."""
    import gradzip
    saved = golden(name, "hook_model")["checkpoints"][0]["hook"]
    assert gradzip.checkpoint.hook_state(saved)["spec"] == "sign:block=0,layers=off"
    state = gradzip.hooks.State("sign:block=0", model=torch.nn.Linear(40, 2))
    with pytest.raises(ValueError, match="saved state is for 'sign:block=0,layers=off'.*ran with layers=off"):
        state.load_state_dict(saved)
    plain = golden(name, "hook")["checkpoints"][0]["hook"]
    assert gradzip.checkpoint.hook_state(plain)["spec"] == SPECS["hook"]


@pytest.mark.parametrize("name", ["format1", "format2"])
def test_an_fsdp_state_before_format_3_reads_as_layers_off(name):
    """Formats 1 and 2 compressed FSDP's chunks whole: their spec reads as layers=off, and
    a State of the bare spec (layer-aware now) refuses them by name."""
    import gradzip
    saved = golden(name, "fsdp")["checkpoints"][0]["fsdp"]
    assert saved["spec"] == "stc:density=0.1"
    assert gradzip.checkpoint.fsdp_state(saved)["spec"] == "stc:density=0.1,layers=off"
    with pytest.raises(ValueError, match=r"saved state is for 'stc:density=0.1,layers=off'.*format 1 or 2 "
                                         r"compressed each chunk whole"):
        gradzip.fsdp.State("stc:density=0.1").load_state_dict(saved)


@pytest.mark.parametrize("door,read", [("gradzip.hooks", "hook_state"), ("gradzip.Aggregation", "aggregation_state")])
def test_a_newer_or_damaged_format_is_refused_by_name(door, read):
    import gradzip.checkpoint as checkpoint
    state = golden("format1", "aggregation" if read == "aggregation_state" else "hook")["checkpoints"][0]
    state = state if read == "aggregation_state" else state["hook"]
    reader = getattr(checkpoint, read)
    with pytest.raises(checkpoint.CheckpointError, match=rf"{door}: the checkpoint is format 7, written by a newer "
                                                          rf"gradzip; this build reads formats 0 to 3"):
        reader({**state, "format": 7})
    for bad in ("1", -1, 1.0, True):
        with pytest.raises(checkpoint.CheckpointError, match="not a format number"):
            reader({**state, "format": bad})
    with pytest.raises(checkpoint.CheckpointError, match="lacks"):
        reader({k: v for k, v in state.items() if k != "spec"})
    for not_a_dict in ([state], 3, None):
        with pytest.raises(checkpoint.CheckpointError, match="a checkpoint is a dict"):
            reader(not_a_dict)
    old = golden("format0", "aggregation" if read == "aggregation_state" else "hook")["checkpoints"][0]
    old = old if read == "aggregation_state" else old["hook"]
    with pytest.raises(checkpoint.CheckpointError, match="says format 1 but its layout is format 0's"):
        reader({**old, "format": 1})


def test_the_fsdp_diloco_and_backend_doors_refuse_a_newer_format():
    import gradzip.checkpoint as checkpoint
    for door in ("gradzip.diloco", "gradzip.load_state_dict"):
        with pytest.raises(checkpoint.CheckpointError, match=rf"{door}: the checkpoint is format 4"):
            checkpoint.format_1_state({"format": 4, "spec": "topk"}, door, ("spec",))
    with pytest.raises(checkpoint.CheckpointError, match=r"gradzip.fsdp: the checkpoint is format 4"):
        checkpoint.fsdp_state({"format": 4, "spec": "topk", "state": {}})


def _backend_refuses_another_spec(rank, world_size):
    import gradzip
    import torch.distributed as dist
    dist.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="topk:density=0.1"))
    saved = gradzip.state_dict()
    assert saved["format"] == 3 and saved["spec"] == "topk:density=0.1"
    try:
        gradzip.load_state_dict({**saved, "spec": "sign"})
    except gradzip.checkpoint.CheckpointError as e:
        return str(e)
    return None


def test_the_backend_door_refuses_another_specs_state():
    for said in run_ranks(_backend_refuses_another_spec, 2):
        assert said == "gradzip.load_state_dict: the saved state is for 'sign', this group runs 'topk:density=0.1'"


def test_a_checkpoint_past_both_density_warmups_resumes_under_the_folded_one():
    """State(optimizer=SGD(momentum)) now adds density_warmup=20 to a sparsifier's spec
    that sets none. A checkpoint of the spec as earlier builds folded it (momentum alone)
    is taken once every tensor has made 20 calls (no call to come takes a warm-up codec
    under either spec); inside the warm-up, or when layers=adapt would choose its levels
    on other calls, it is refused, naming both specs and what to write to resume it as it
    ran."""
    import gradzip
    params = list(torch.nn.Linear(3, 2).parameters())
    state = gradzip.hooks.State("stc:density=0.05", optimizer=torch.optim.SGD(params, lr=0.1, momentum=0.9))
    assert str(state.spec) == "stc:density=0.05,density_warmup=20,momentum=0.9"

    def saved(calls):
        return {"format": gradzip.checkpoint.FORMAT, "spec": "stc:density=0.05,momentum=0.9", "start_iter": 0,
                "iteration": max(calls), "state": {f"bucket:{i}/calls": torch.tensor([c]) for i, c in enumerate(calls)}}

    state.load_state_dict(saved([20, 75]))
    assert state.iteration == 75
    with pytest.raises(ValueError, match=r"saved state is for 'stc:density=0.05,momentum=0.9', this State runs "
                                         r"'stc:density=0.05,density_warmup=20,momentum=0.9' \(their density warm-ups "
                                         r"differ.* write the saved spec's density_warmup \(0 where it has none\)"):
        state.load_state_dict(saved([75, 19]))
    by_hand = gradzip.hooks.State("stc:density=0.05,density_warmup=0",
                                  optimizer=torch.optim.SGD(params, lr=0.1, momentum=0.9))
    by_hand.load_state_dict(saved([75, 19]))  # as it ran
    # Per parameter (State(model=...)), layers=auto is adapt for STC, which chooses levels
    # every adapt_every (100) calls after the density warm-up: warm-ups 20 calls apart
    # choose on other calls, so its state is refused at any count, with or without levels.
    per_parameter = saved([75, 80])
    per_parameter["state"] = {"fc.weight/calls": torch.tensor([90]), "fc.bias/calls": torch.tensor([90])}
    with pytest.raises(ValueError, match="chooses layers=adapt's levels on another schedule"):
        state.load_state_dict(per_parameter)
    with pytest.raises(ValueError, match="saved state is for 'topk:density=0.05,momentum=0.9'") as refused:
        state.load_state_dict({**saved([75, 80]), "spec": "topk:density=0.05,momentum=0.9"})  # another codec
    assert "density warm-ups" not in str(refused.value)
    with pytest.raises(ValueError, match="saved state is for"):  # another key differs: refused at any count
        gradzip.hooks.State("stc:density=0.1", optimizer=torch.optim.SGD(params, lr=0.1, momentum=0.9)) \
            .load_state_dict(saved([75, 80]))
