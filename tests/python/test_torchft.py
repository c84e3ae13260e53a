"""gradzip's hook inside a torchft job (gradzip.torchft, examples/train_torchft.py), with real
processes: a lighthouse and two replica groups of one rank train Fashion-MNIST with top-k 10%;
replica 1 is SIGKILLed inside a step, the survivor's step fails and is not committed, it
trains on alone, a new replica 1 joins and heals from it, and both end with the same
parameters, bit for bit, having sent compressed bytes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchft", reason="torchft is not installed (pip install torchft-nightly; scripts/requirements.txt)")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_torchft.py"
STEPS, KILL_AT = 40, 12


def test_a_killed_replica_heals_and_ends_equal_to_the_survivor(tmp_path):
    events_file = tmp_path / "events.jsonl"
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--kill-at", str(KILL_AT),
                           "--restart-delay", "1.5", "--step-time", "0.05", "--spec", "topk:density=0.1",
                           "--events", str(events_file)],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["exit_codes"] == [0, -9, 0], summary
    survivor, healed = summary["final"]
    assert survivor["step"] == healed["step"] == STEPS
    assert healed["params"] == survivor["params"]

    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    steps = [e for e in events if e["event"] == "step" and e["replica"] == 0]
    failed = [e for e in steps if not e["committed"]]
    assert [e["step"] for e in failed] == [KILL_AT]  # the step replica 1 died in, and no other
    before = next(e for e in steps if e["step"] == KILL_AT - 1 and e["committed"])
    assert failed[0]["params"] == before["params"]  # not committed: the parameters did not move
    alone = [e for e in steps if e["committed"] and e["participants"] == 1 and e["step"] >= KILL_AT]
    assert alone, "the survivor trained on alone"
    rejoined = [e for e in events if e["event"] == "step" and e["replica"] == 1 and e["t"] > failed[0]["t"]]
    assert rejoined[0]["step"] > KILL_AT and rejoined[0]["participants"] == 2  # healed to the survivor's step
    for e in rejoined:  # from its first step on, the same parameters as the survivor's
        assert e["params"] == next(s["params"] for s in steps if s["step"] == e["step"] and s["committed"])

    for stats in (survivor["stats"], healed["stats"]):
        assert 0 < stats["bytes_sent"] < 0.3 * stats["dense_bytes"], stats
    assert survivor["stats"]["replicas_departed"] == 1 and survivor["stats"]["dropped_residual_l1"] > 0
    assert healed["stats"]["replicas_departed"] == 0
    assert [f["failed_step"] for f in summary["failures"]] == [KILL_AT]
