"""Session -> profile entry or refusal, and the headline: pure functions on fixed sessions."""

import dataclasses

from blockwidth.console.outcome import Front, PairFacts, Refusal, RefusalKind, Tone, headline, in_effect_note, profile_entry
from blockwidth.engine.ab import Budget, Verdict, decide
from blockwidth.policy.device import parse_device_spec
from blockwidth.policy.profile import Entry
from tests.states import BUDGET_S, demo_pair, fixture_session

CPU = parse_device_spec("cpu")


def _entry(session, **kw):
    pair = demo_pair()
    return profile_entry(session, PairFacts(pair.kind, pair.quantization, pair.pair_id), CPU, mlx="0.32.4",
                         measured_at="2026-01-01T00:00:00Z", record="r.json", **kw)


def test_a_win_becomes_an_entry_with_its_evidence():
    e = _entry(fixture_session())
    assert isinstance(e, Entry) and e.width == 4 and not e.decline and e.byte_identical
    assert e.backend.value == "cpu" and e.quant_scheme == "none" and e.pair is None
    assert e.evidence["width_tok_s"] == [60.0, 62.0, 63.0] and e.evidence["record"] == "r.json"
    assert _entry(fixture_session(), pair_specific=True).pair == demo_pair().pair_id
    h = headline(fixture_session())
    assert (h.tone, h.saveable) == (Tone.GOOD, True) and "width 4 beats classic" in h.text


def test_refusals_are_worded_for_each_front_end():
    r = _entry(fixture_session(cancelled=True))
    assert isinstance(r, Refusal) and r.kind is RefusalKind.CANCELLED
    assert headline(fixture_session(cancelled=True)).tone is Tone.STOPPED

    drifted = fixture_session(drift=True)
    r = _entry(drifted)
    assert isinstance(r, Refusal) and r.kind is RefusalKind.DRIFT
    h = headline(drifted)
    assert not h.saveable and h.tone is Tone.WARN  # never green above a refusal
    # 2 + 2 classic runs apart happen by chance a third of the time: not called "drifted"
    assert "not saveable yet: too few classic runs to tell drift from noise at n " in h.text
    drifted.drift_chance = 0.01
    assert headline(drifted).text.startswith("not saveable: classic drifted")

    s = fixture_session()
    for arm in s.arms:  # every faster width now differs from classic
        arm.identity = type(arm.identity)(**{**arm.identity.to_dict(), "identical_ids": False,
                                             "first_divergence": 3})
    decide(s)
    r = _entry(s)
    assert isinstance(r, Refusal) and r.kind is RefusalKind.DIFFERS
    assert "--allow-nonidentical" in r.say(Front.CLI) and "--" not in r.say(Front.CONSOLE)
    kept = _entry(s, allow_nonidentical=True)
    assert isinstance(kept, Entry) and not kept.byte_identical


def test_a_lost_width_in_effect_is_flagged():
    s = fixture_session()
    assert in_effect_note(s, 4)[1] is Tone.GOOD
    assert in_effect_note(s, 8)[1] is Tone.BAD and "SLOWER" in in_effect_note(s, 8)[0]
    # the width that won is named beside the one in effect: the top and the session's headline
    # read as one answer
    assert in_effect_note(s, 8)[0].endswith("; w4 beats classic (s saves it)")
    assert in_effect_note(s, 6)[1] is Tone.WARN  # not measured
    assert in_effect_note(fixture_session(cancelled=True), 4) is None


def test_every_width_slower_saves_a_decline():
    s = fixture_session()
    for arm in s.arms:
        for run in arm.runs:
            run.decode_s *= 3
    decide(s)
    assert all(a.verdict is Verdict.SLOWER for a in s.arms)
    e = _entry(s)
    assert isinstance(e, Entry) and e.decline and e.width is None
    assert headline(s).tone is Tone.PLAIN


def _undecided(**config):
    """The fixture with every width's runs at classic's speeds: all overlap, so undecided."""
    s = fixture_session()
    s.config = dataclasses.replace(s.config, **config)
    for arm in s.arms:
        for run, c in zip(arm.runs, s.classic.runs):
            run.decode_s = c.decode_s
    decide(s)
    assert all(a.verdict is Verdict.UNDECIDED for a in s.arms)
    return s


def test_an_undecided_session_gets_one_piece_of_advice_in_its_front_ends_words():
    """Three pieces of advice (sweep's --max-reps, "raise n above 12", "n 7 or sequential mode")
    and none of them worked in the console. Now one, from the session's facts: overlapping
    ranges are never parted by more repetitions (a range only widens), so the advice there is
    longer runs; the headline and the save refusal say the same words, in each front end's own
    controls, and the session's why-line carries no front end's words at all."""
    s = _undecided()  # sequential, as the console runs it: at most 12 repetitions, BUDGET_S s
    assert s.config.sequential and s.reps == 3 and s.config.max_tokens == 16
    s.budget_out = Budget.SECONDS
    # every width at classic's speed: its interval may yet settle below the minimum gain, so
    # more repetitions can decide, and the budget that ended it is the advice
    # (built by hand: no repetition times, so the budget doubled is the amount)
    assert _entry(s).say(Front.CONSOLE) == ("undecided: ranges overlap; it ran out of time after 3 "
                                            f"repetitions: raise the secs field to {2 * BUDGET_S}")
    # w4 now looks 1.4x faster, but one slow run leaves its range over classic's: no repetition
    # parts them, so the advice is longer runs
    w4 = s.arm(4)
    for run, v in zip(w4.runs, [39.0, 58.0, 60.0]):
        run.decode_s = len(run.tokens) / v
    decide(s)
    assert w4.verdict is Verdict.UNDECIDED
    r = _entry(s)
    assert isinstance(r, Refusal) and r.kind is RefusalKind.UNDECIDED
    console, cli = r.say(Front.CONSOLE), r.say(Front.CLI)
    assert console == ("undecided: ranges overlap; more repetitions cannot part them; "
                       "raise the tokens field to 64 (longer runs even out this host's noise)")
    assert cli.endswith("rerun with --max-tokens 64 (longer runs even out this host's noise)")
    assert headline(s, front=Front.CONSOLE).text == console
    assert "--" not in console and "more repetitions may decide" not in s.why and "n 7" not in s.why
    s.config = dataclasses.replace(s.config, max_tokens=512)
    assert "too close to separate on this host" in _entry(s).say(Front.CONSOLE)


def test_advice_without_overlap_names_the_budget_that_ended_it():
    """Where more repetitions can decide (drift that may be noise; an interval verdict), the
    advice is the budget field that ran out, doubled, or the sequential box when it is off."""
    from blockwidth.console.outcome import MoreRuns

    runs = MoreRuns(overlap=False, sequential=True, reps=4, max_reps=12, max_seconds=60,
                    budget_out=Budget.SECONDS, tokens=64)
    assert runs.say(Front.CONSOLE) == "it ran out of time after 4 repetitions: raise the secs field to 120"
    assert runs.say(Front.CLI) == "it ran out of time after 4 repetitions: rerun with --max-seconds 120"
    reps = dataclasses.replace(runs, budget_out=Budget.REPS, reps=12)
    assert reps.say(Front.CONSOLE).endswith("raise the reps field to 24")
    assert reps.say(Front.CLI).endswith("rerun with --max-reps 24")
    fixed = dataclasses.replace(runs, sequential=False)
    assert fixed.say(Front.CONSOLE).startswith("turn on sequential") and "--sequential" in fixed.say(Front.CLI)
    drifted = fixture_session(drift=True)
    assert drifted.drift_could_be_noise
    # more classic runs tell drift from noise: the reps budget is the advice
    assert "raise the reps field to 24" in headline(drifted, front=Front.CONSOLE).text


def test_an_undecided_session_is_not_saveable_anywhere():
    """One rule (policy.verdict.saveable): the record said "saveable": true for an undecided
    session (no drift, not cancelled) while save refused it. The record, what sweep --json
    prints (the record's decision), the headline and save now agree, and a record written
    before the rule reads by its verdicts, not by its stored flag."""
    from blockwidth.engine.session import record
    from blockwidth.policy.verdict import RefusalKind as Kind

    host = {"device": {"backend": "cpu"}, "mlx": "0.32.4"}
    for s, kind in ((_undecided(), Kind.UNDECIDED), (fixture_session(), None),
                    (fixture_session(drift=True), Kind.DRIFT),
                    (fixture_session(cancelled=True), Kind.CANCELLED)):
        rec = record.build(s, demo_pair(), host)
        entry = _entry(s)
        assert s.saveable is (kind is None) is rec["decision"]["saveable"] is headline(s).saveable
        assert record.refusal(rec) is kind
        assert isinstance(entry, Entry) if kind is None else entry.kind is kind
    old = record.build(_undecided(), demo_pair(), host)
    old["decision"]["saveable"] = True  # as the old rule wrote it
    assert record.refusal(old) is Kind.UNDECIDED
    differs = fixture_session()
    for arm in differs.arms:
        arm.identity = type(arm.identity)(**{**arm.identity.to_dict(), "identical_ids": False,
                                             "first_divergence": 3})
    decide(differs)
    assert not differs.saveable and record.refusal(record.build(differs, demo_pair(), host)) is Kind.DIFFERS


def test_measured_advice_names_the_field_and_an_amount_from_the_repetitions_times():
    """An undecided workload session that ran out of its seconds budget (the n repetitions spent
    it) said "raise the secs field to 120" (the budget doubled), which on a 2-core CPU bought no
    repetition at all. With the repetitions' times the amount is where the last repetition
    ended plus what the next ones cost, so that two more start within it; a reps budget that
    would stop them first is raised too. One piece of advice, in each front end's controls."""
    from blockwidth.console.outcome import MoreRuns

    runs = MoreRuns(overlap=False, sequential=True, reps=2, max_reps=6, max_seconds=60,
                    budget_out=Budget.SECONDS, tokens=32, rep_s=41.0, last_rep_at=95.0)
    # the second more starts before 95 + 41 = 136 s; half a repetition of room: 156.5 -> 160
    assert runs.seconds_for_more() == 160
    assert runs.say(Front.CONSOLE) == ("it ran out of time after 2 repetitions (41 s a repetition here): "
                                       "raise the secs field to 160 for 2 more")
    assert runs.say(Front.CLI).endswith("rerun with --max-seconds 160 for 2 more")
    # the reps budget would stop them too: both, in one line
    tight = dataclasses.replace(runs, max_reps=3)
    assert tight.say(Front.CONSOLE).endswith("raise the secs field to 160 and the reps field to 4 for 2 more")
    assert tight.say(Front.CLI).endswith("rerun with --max-seconds 160 --max-reps 4 for 2 more")
    # a single prompt's repetitions are cheap: half as many again, within the seconds left
    single = MoreRuns(overlap=False, sequential=True, reps=12, max_reps=12, max_seconds=180,
                      budget_out=Budget.REPS, tokens=32, rep_s=1.2, last_rep_at=20.0)
    assert single.say(Front.CONSOLE) == ("it stopped after 12 repetitions (1 s a repetition here): "
                                         "raise the reps field to 18 for 6 more")


def test_a_real_sequential_session_keeps_its_repetitions_times():
    """The engine notes where each repetition ended, which the advice reads."""
    from blockwidth.console.outcome import more_runs, rep_seconds
    from blockwidth.engine.ab import AbConfig, run_session

    cfg = AbConfig(widths=(2,), prompt="def f", n=2, max_tokens=8, sequential=True, max_reps=2,
                   warmup=False, exactness=False, predict=False)
    s = run_session(demo_pair(), cfg)
    assert s.reps == 2 and len(s.rep_ends) == 2 and 0 < s.rep_ends[0] < s.rep_ends[1] <= s.elapsed_s
    m = more_runs(s)
    assert m.last_rep_at == s.rep_ends[-1] and m.rep_s == rep_seconds(s) > 0


def test_a_workload_whose_requests_disagree_is_not_advised_more_repetitions():
    """On the CPU demo pair w2's requests ran 0.56x to 1.32x (the @mixed workload, 2026-12-02):
    the interval resamples the requests, so more passes narrow the run noise but never that
    spread, and "raise secs" would not decide it. Where the requests-only interval straddles
    the bar, the advice says so and names what does decide: the traffic's own workload."""
    from blockwidth.console.outcome import MoreRuns
    from blockwidth.policy.stats import request_spread

    def req(ratio):  # classic 10 tok/s; the width at ratio x that, two runs each
        return [(10.0, 1.0), (10.0, 1.0)], [(10.0, 1.0 / ratio), (10.0, 1.0 / ratio)]

    mixed = [req(r) for r in (0.56, 0.7, 0.9, 1.1, 1.25, 1.32)]
    ci, lo, hi = request_spread([c for c, _ in mixed], [a for _, a in mixed], seed=1)
    assert ci.lo < 1.03 < ci.hi and (round(lo, 2), round(hi, 2)) == (0.56, 1.32)
    agree = [req(r) for r in (1.4, 1.45, 1.5, 1.5, 1.55, 1.6)]
    ci, _, _ = request_spread([c for c, _ in agree], [a for _, a in agree], seed=1)
    assert ci.lo > 1.03  # consistent requests: the spread is no obstacle

    runs = MoreRuns(overlap=False, sequential=True, reps=2, max_reps=6, max_seconds=180,
                    budget_out=Budget.SECONDS, tokens=32, rep_s=62.0, last_rep_at=299.0,
                    spread=("w2", 0.56, 1.32))
    said = runs.say(Front.CONSOLE)
    assert said.startswith("w2's requests disagree (0.56x to 1.32x by request)") and "secs" not in said
    assert "the prompt field (@FILE)" in said and "--workload FILE" in runs.say(Front.CLI)
    # on the operator's own file it was told to measure the traffic it had just measured (a tryout)
    from dataclasses import replace

    own = replace(runs, own_traffic=True).say(Front.CONSOLE)
    assert "@FILE" not in own and "traffic you serve" not in own and "a workload per kind of request" in own


def test_an_entry_says_how_its_identity_was_had_and_against_which_classic():
    """A session on the exact path (engine.exact) saves the plan's answer and the speed-ups'
    control in the entry's evidence, and the profile keeps it through a write and a read."""
    from blockwidth.engine import exact
    from blockwidth.policy import profile

    s = fixture_session()
    s.exact = exact.Plan(exact.Exact.AUTO, "cuda", True, True, "on: ...")
    s.baseline = "classic-stock"
    e = _entry(s)
    assert e.evidence["exact"] == {"asked": "auto", "active": True, "exact": True, "control": "classic-stock"}
    back = profile.parse(profile.dumps([e]), "p.toml")
    assert back[0].evidence["exact"]["control"] == "classic-stock"


def test_a_prediction_slower_than_classic_is_not_called_a_best_width():
    """A tryout read "model prediction ... best width 2" beside w2 predicted at 0.85x: the words
    say no width is predicted faster where even the best is not."""
    from types import SimpleNamespace

    from blockwidth.engine.ab import Session

    model = "model prediction (cost curve x acceptance, not a measurement): "
    slower = SimpleNamespace(predicted_best=2, predicted={2: 0.85, 4: 0.7},
                             predicted_note="best width 2 (5 repeats per row count agree)")
    assert Session.prediction_line(slower) == \
        model + "no width predicted faster than classic (the closest: w2, 0.85x)"
    faster = SimpleNamespace(predicted_best=4, predicted={2: 1.1, 4: 1.3}, predicted_note=None)
    assert Session.prediction_line(faster) == model + "best width 4"
    # the CLI and the console, where there are no terms per width, list each width's figure
    assert Session.prediction_line(faster, per_width=True) == model + "best width 4  [w2 1.10x, w4 1.30x]"
    noted = SimpleNamespace(predicted_best=4, predicted={4: 1.3}, predicted_note="best width 4 (agree)")
    assert Session.prediction_line(noted) == model + "best width 4 (agree)"


def test_the_records_markdown_says_the_prediction_in_the_front_ends_words():
    """The record's Markdown says the prediction with the CLI's and the console's words: a best
    width predicted slower than classic is not called one, a resolved one keeps its note, and an
    unresolved prediction says why."""
    import json
    from pathlib import Path

    from blockwidth.engine.session import record

    rec = json.loads((Path(__file__).resolve().parents[1] / "examples/records/cpu-demo-4bit-decline.json").read_text())
    model = "\nModel prediction (cost curve x acceptance, not a measurement): "
    assert rec["predicted_best"] == 4 and rec["predicted_speedup"]["4"] < 1
    assert model + "no width predicted faster than classic (the closest: w4, 0.70x)\n" in record.markdown(rec)
    rec["predicted_speedup"] = {"4": 1.3, "8": 0.9}
    rec["predicted_note"] = "best width 4 (5 repeats per row count agree)"
    assert model + "best width 4 (5 repeats per row count agree)\n" in record.markdown(rec)
    rec["predicted_best"], rec["predicted_note"] = None, "best width not resolved at this n (1 repeat per row count)"
    assert model + "best width not resolved at this n (1 repeat per row count)\n" in record.markdown(rec)
