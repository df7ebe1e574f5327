"""The auto width in the real engine, on the demo pair on this CPU: byte identity at every width
the controller takes (every drafter kind), drafters that keep up through rounds that draft
nothing, and a trajectory replayed from what a record keeps."""

import json

import pytest

from blockwidth.engine import auto
from blockwidth.engine.decode import classic, speculative
from blockwidth.engine.demo.prompts import DEMO_PROMPTS
from blockwidth.policy.auto import Costs, DraftCost, Params, State

TOKENS = 40


class Scripted:
    """A width source that takes the widths it is given, in turn: every width 1..8 and back."""

    def __init__(self, seq):
        self.seq, self.widths = seq, []
        self.cap = max(seq)  # the widest it hands out: what the caches and drafter are sized for

    def __call__(self, rounds):
        assert len(rounds) == len(self.widths)  # asked once per round, with the rounds so far
        w = self.seq[len(self.widths) % len(self.seq)]
        self.widths.append(w)
        return w

    def close(self, rounds):
        assert len(rounds) == len(self.widths)

    def to_dict(self):
        return {"widths": list(self.widths)}


MIXED = [1, 1, 3, 1, 4, 2, 1, 5, 8, 1, 6, 7]


@pytest.fixture(scope="module")
def pairs(demo_pairs):
    return {"model": demo_pairs(), **{kind: demo_pairs(kind) for kind in ("lookup", "dflash", "mtp")}}


@pytest.fixture(scope="module")
def references(pairs):
    out = {}
    for i in (0, 3):
        ids = pairs["model"].tokenizer.encode(DEMO_PROMPTS[i])
        out[i] = (ids, classic(pairs["model"], ids, TOKENS).tokens)
    return out


@pytest.mark.parametrize("kind", ["model", "lookup", "dflash", "mtp"])
def test_every_width_the_loop_is_handed_keeps_classic_output(pairs, references, kind):
    ids, ref = references[0]
    run = speculative(pairs[kind], ids, TOKENS, Scripted(MIXED))
    assert run.tokens == ref
    assert run.width == "auto" and len(run.widths) == len(run.rounds)
    assert set(run.widths) == set(MIXED) and run.summary()["widths"] == run.widths
    for w, r in zip(run.widths, run.rounds):
        assert r.drafted <= w - 1 and r.accepted <= r.drafted
        if w == 1:
            assert r.drafted == 0 and r.emitted == 1


@pytest.mark.parametrize("kind", ["model", "dflash", "mtp"])
def test_a_drafter_keeps_up_through_rounds_that_draft_nothing(pairs, references, kind):
    # Rounds at width 1 feed the drafter nothing; the text they emit reaches it at the next
    # round that drafts. A drafter that dropped it drafts from a text with holes: its
    # acceptance fell to 0.30 (model, DFlash) and 0.54 (MTP) of the demo's 0.62-0.85.
    ids, ref = references[0]
    fixed = speculative(pairs[kind], ids, TOKENS, 4)
    mixed = speculative(pairs[kind], ids, TOKENS, Scripted(MIXED))
    assert mixed.acceptance > 0.85 * fixed.acceptance


def _controller(pair, max_width=6):
    costs, curve = auto.calibrate(pair, max_width=max_width, context=64, repeats=1)
    return auto.Controller(costs, Params(max_width=max_width), curve=curve)


def test_the_controller_on_the_demo_pair_keeps_classic_output_and_replays(pairs, references):
    pair = pairs["model"]
    c = _controller(pair)
    assert set(c.costs.verify_ms) == set(range(1, 7)) and c.costs.draft_ms > 0  # a draft model's step
    seen = []
    for i in (0, 3, 0):
        ids, ref = references[i]
        run = speculative(pair, ids, TOKENS, c.run())
        assert run.tokens == ref
        seen.append(run)
    assert c.state.requests == 3 and c.state.rounds == sum(len(r.rounds) for r in seen)
    # The record keeps the costs and parameters once, each run's start state and its rounds
    # (rounded as the rounds table rounds them): replayed from those alone, through JSON, the
    # widths come out as they were
    kept = json.loads(json.dumps({"controller": c.to_dict(),
                                  "runs": [dict(r.summary(), rounds_detail=r.rounds_table()) for r in seen]}))
    costs = Costs.from_dict(kept["controller"]["costs"])
    params = Params.from_dict(kept["controller"]["params"])
    for run, stored in zip(seen, kept["runs"]):
        start = State.from_dict(stored["auto"]["start"])
        assert auto.replay(costs, params, start, stored["rounds_detail"]) == run.widths == stored["widths"]
    # each run started where the one before left the controller: the pool carries across requests
    assert seen[1].auto["start"]["rounds"] == len(seen[0].rounds)


def test_forced_trajectories_through_the_controller_keep_output(pairs, references):
    # Costs that make it move: a GPU-like flat curve, then acceptance decides; on the demo
    # pair's drafter it speculates wide, and a rejecting lookup drafter sends it to 1 and probes
    flat = Costs({k: 10.0 + 0.3 * k for k in range(1, 9)}, DraftCost.LINEAR, 0.5)
    for kind in ("model", "lookup"):
        c = auto.Controller(flat, Params(max_width=8))
        for i in (0, 3):
            ids, ref = references[i]
            run = speculative(pairs[kind], ids, TOKENS, c.run())
            assert run.tokens == ref
    assert len(set(run.widths)) >= 2


def test_the_process_wide_controller_is_one_per_pair_and_settings(pairs):
    auto.forget()
    try:
        a = auto.shared(pairs["lookup"], max_width=4, context=32)
        assert auto.shared(pairs["lookup"], max_width=4, context=32) is a
        assert auto.shared(pairs["lookup"], max_width=3, context=32) is not a
        assert a.costs.draft_ms == 0.0  # lookup drafting is learnt from the rounds, not measured
    finally:
        auto.forget()


def test_an_auto_arm_in_a_session_keeps_the_rules_and_its_record_replays(pairs, tmp_path):
    from blockwidth.console import records
    from blockwidth.engine.session import host, record
    from blockwidth.engine.ab import AbConfig, Verdict, run_session

    auto.forget()
    try:
        config = AbConfig(widths=("auto", 2), prompt=DEMO_PROMPTS[0], n=2, max_tokens=16,
                          predict=False, exactness=False, auto_max=4)
        session = run_session(pairs["model"], config)
        a = session.arm("auto")
        assert a.name == "auto" and len(a.runs) == 2 and a.verdict is not Verdict.NOT_MEASURED
        # interleaved with the others, classic opening and closing; identical to classic
        assert session.order == ["classic", "auto", "w2", "classic", "auto", "w2", "classic"]
        assert a.identity.identical_ids and all(r.tokens == session.classic.runs[0].tokens for r in a.runs)
        assert session.auto is auto.shared(pairs["model"], attention=session.attention, max_width=4)
        path = records.write(record.build(session, pairs["model"], host.identity()), tmp_path)
    finally:
        auto.forget()
    rec = record.load(path)
    arm = next(x for x in rec["arms"] if x["arm"] == "auto")
    assert arm["width"] == "auto" and rec["config"]["auto_max"] == 4
    costs = Costs.from_dict(rec["auto"]["costs"])
    params = Params.from_dict(rec["auto"]["params"])
    assert set(costs.verify_ms) == {1, 2, 3, 4} and params.max_width == 4
    for s in arm["samples"]:
        assert len(s["widths"]) == len(s["rounds_detail"]) and set(s["widths"]) <= {1, 2, 3, 4}
        start = State.from_dict(s["auto"]["start"])
        assert auto.replay(costs, params, start, s["rounds_detail"]) == s["widths"]
    # the warm-up ran the controller too (a server's first request does): the first measured
    # run starts from the state the warm-up left
    assert arm["samples"][0]["auto"]["start"]["requests"] == 1


WORKLOAD = [
    '{"id": "code", "prompt": "def fibonacci(n):\\n    \\"\\"\\"Return the n-th Fibonacci number.\\"\\"\\"\\n"}',
    '{"id": "repeat", "prompt": "one two three four one two three four one two three four one two"}',
    '{"id": "prose", "prompt": "The history of the city begins in"}',
]


def test_sweep_over_a_workload_reports_auto_against_the_oracle_and_the_record_reproduces_it(tmp_path, blockwidth):
    from blockwidth.engine.session import record

    wl = tmp_path / "three.jsonl"
    wl.write_text("\n".join(WORKLOAD) + "\n")
    r = blockwidth("sweep", "--workload", str(wl), "--widths", "auto,2,3", "-n", "2", "--max-tokens", "10",
                   "--seed", "5", "--record-dir", str(tmp_path / "rec"), "--json")
    assert r.returncode in (0, 1), r.stderr
    out = json.loads(r.stdout)
    o = out["auto"]["oracle"]
    assert o["requests"] == 3 and len(o["oracle_picks"]) == 3 and o["seed"] == 5
    assert o["best_fixed"] in ("classic", "w2", "w3", "w4")  # w4: the width in effect, always added
    assert o["of_oracle_ci"][0] <= o["of_oracle"] <= o["of_oracle_ci"][1]
    assert o["of_best_ci"][0] <= o["of_best"] <= o["of_best_ci"][1]
    # every request's auto runs are classic's output, and keep their widths by round
    for req in out["requests"]:
        a = next(x for x in req["arms"] if x["arm"] == "auto")
        assert a["identity"]["identical_ids"] and all(s["widths"] for s in a["samples"])
    rec = record.load(out["record_path"])
    again = record.reproduce_oracle(rec)
    assert again.to_dict() == rec["auto"]["oracle"]
    # every auto sample of every request replays from the record alone
    costs, params = Costs.from_dict(rec["auto"]["costs"]), Params.from_dict(rec["auto"]["params"])
    for req in rec["requests"]:
        for s in next(x for x in req["arms"] if x["arm"] == "auto")["samples"]:
            assert auto.replay(costs, params, State.from_dict(s["auto"]["start"]), s["rounds_detail"]) == s["widths"]
    text = blockwidth("sweep", "--workload", str(wl), "--widths", "auto,2", "-n", "1", "--max-tokens", "6",
                      "--record-dir", str(tmp_path / "rec"))
    assert "auto against hindsight (3 requests" in text.stdout and "of the per-request oracle" in text.stdout


@pytest.mark.parametrize("args, problem", [
    (("--auto-max", "6"), "--auto-max 6: only applies with auto among --widths"),
    (("--widths", "auto,2", "--auto-max", "1"), "--auto-max: 1 is out of range 2..64"),
    (("--widths", "auto,2", "--path", "mlx-lm-server"), "cannot adapt per round"),
])
def test_auto_options_it_cannot_honour_are_one_line(args, problem, blockwidth):

    r = blockwidth("sweep", *args)
    assert r.returncode == 2 and problem in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_auto_arm_that_never_speculates_is_still_measured(demo_pairs):
    # A cost curve where no width pays even at acceptance 1 (K rows cost K times one): the
    # controller stays at 1 and never probes; its rounds are its decisions, not declines
    from blockwidth.engine.ab import Arm, _facts

    cpu = Costs({k: 5.0 * k for k in range(1, 5)}, DraftCost.LINEAR, 1.0)
    c = auto.Controller(cpu, Params(max_width=4))
    pair = demo_pairs("lookup")
    ids = pair.tokenizer.encode(DEMO_PROMPTS[0])
    run = speculative(pair, ids, 8, c.run())
    assert set(run.widths) == {1} and run.speculative_rounds == 0 and run.declined_rounds == 0
    facts = _facts(Arm("auto", [run]))
    assert facts.speculative_rounds == len(run.rounds) and facts.declined_rounds == 0


def test_the_gpu_command_runs_an_auto_arm_over_the_mixed_workload_on_the_demo_pair(tmp_path, blockwidth):
    """What the coordinator runs on the H200 (sweep --workload mixed --widths auto,4,8,12
    --verify-attention rows --seed --record-dir --json), at its smallest on the demo pair, over the
    built-in chat workload (8 short requests: mixed's long prompts, prefilled in bfloat16 on this
    CPU by every arm, made this test 33 s; test_workload runs mixed itself): the parser takes it,
    every request's auto runs are classic's output with their widths by round, and the oracle
    covers every request of the built-in workload."""
    from blockwidth.policy import workload

    r = blockwidth("sweep", "--workload", "chat", "--widths", "auto,4", "-n", "1", "--max-tokens", "4",
                   "--verify-attention", "rows", "--seed", "23", "--record-dir", str(tmp_path / "rec"),
                   "--json")
    assert r.returncode in (0, 1), r.stderr
    out = json.loads(r.stdout)
    n = len(workload.builtin("chat").requests)
    assert len(out["requests"]) == n and [a["arm"] for a in out["arms"]] == ["classic", "auto", "w4"]
    for req in out["requests"]:
        a = next(x for x in req["arms"] if x["arm"] == "auto")
        assert a["identity"]["identical_ids"], req["id"]
        assert all(s["widths"] and len(s["widths"]) == s["rounds"] for s in a["samples"]), req["id"]
    o = out["auto"]["oracle"]
    assert o["requests"] == n and len(o["oracle_picks"]) == n and o["seed"] == 23
    assert o["of_oracle_ci"][0] <= o["of_oracle"] <= o["of_oracle_ci"][1]
