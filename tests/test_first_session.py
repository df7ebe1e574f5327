"""A first session's words agree with its table, a win needs its p below alpha, a
cancelled run concludes nothing it did not measure, the pilot prices a session (prefill
counted), and careless pairs are refused in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from blockwidth.console import cli
from blockwidth.console.outcome import Front, headline, in_effect_note, next_step
from blockwidth.console.render import request_table
from blockwidth.engine.ab import AbConfig, Arm, RequestArms, Session, Verdict, decide
from blockwidth.engine.costcurve import CostCurve
from blockwidth.engine.workload import PROMPT, Prepared
from blockwidth.policy import pace, stats
from blockwidth.policy.verdict import ArmFacts
from blockwidth.policy.verdict import decide as rules_decide
from blockwidth.policy.workload import Request
from tests.states import _run, demo_pair, fixture_session

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "engine" / "demo" / "pair"


# ---- the verdict's words -----------------------------------------------------------------------

def _tie() -> Session:
    """w2 and w4 both win, w4 a little faster, their intervals overlapping: the tie rule picks w2."""
    s = fixture_session()
    speeds = {2: [60.0, 61.0, 62.0], 4: [61.5, 62.5, 63.5], 8: [30.0, 31.0, 33.0]}
    out = s.classic.runs[0].tokens
    for arm in s.arms:
        arm.runs = [_run(arm.width, v, out) for v in speeds[arm.width]]
    decide(s)
    assert s.recommendation == 2 and s.choice.best == 4, s.why
    return s


def test_the_headline_names_the_tie_rule_when_it_picks_a_width_that_is_not_the_fastest():
    s = _tie()
    h = headline(s).text
    assert h.startswith("width 2 beats classic") and "tie rule" in h and "w4 is the fastest" in h


def test_the_width_in_effect_is_never_called_slower_than_the_width_the_table_marks_fastest():
    s = _tie()
    said, _ = in_effect_note(s, 4)  # w4 is the fastest: the table's "(fastest)"
    assert "fastest" in said and "chooses w2" in said and "is faster" not in said
    said, _ = in_effect_note(s, 2)
    assert "best measured here" in said


# ---- a win needs its p below alpha ------------------------------------------------------------

def test_n_2_cannot_win_and_n_3_can():
    assert stats.runs_for() == 3  # with classic's closing run: 1/C(5,2) = 0.1, 1/C(7,3) = 1/35
    classic = [40.0, 41.0, 42.0]
    for n, classic_runs, p in ((2, classic, 0.1), (3, [*classic, 40.5], 1 / 35)):
        arm = ArmFacts("w2", 2, tuple([60.0, 61.0, 62.0][:n]), speculative_rounds=10, identical=True)
        est = stats.Estimate(1.74, stats.Interval(1.11, 2.63), p, "exact", stats.disjoint_p(n, len(classic_runs)))
        for single in (True, False):
            d = rules_decide(classic_runs, [arm], estimates={2: est}, single=single)
            verdict, why = d.verdicts[0]
            if n == 2:
                assert verdict is Verdict.UNDECIDED and "not below the 0.05 a win needs" in why
                assert "more repetitions can" in why and d.recommendation is None
            else:
                assert verdict is Verdict.WINS and d.recommendation == 2


def test_estimates_carry_the_smallest_p_their_counts_allow():
    classic = [[(32, 1.0), (32, 1.0), (32, 1.1)]]
    arm = [[(32, 0.5), (32, 0.52)]]
    est = stats.estimates(classic, {2: arm}, seed=1, resamples=200)[2]
    assert est.p_floor == pytest.approx(0.1) and est.p == pytest.approx(0.1)


# ---- cancelled runs conclude nothing about what they did not measure --------------------------

def _workload_session(ran: int) -> Session:
    """Three requests, widths 2 and 4; only the first ``ran`` measured on every arm (a cancel)."""
    pair = demo_pair()
    out = pair.tokenizer.encode(" = []\n")[:4]
    reqs = []
    for i in range(3):
        prep = Prepared(Request(f"r{i}", prompt=f"x{i}", line=i + 1), (1, 2, 3), 4, PROMPT)
        runs = i < ran
        classic = Arm(None, [_run(None, 40.0, out)] if runs else [], verdict=Verdict.CONTROL)
        arms = [Arm(w, [_run(w, 50.0, out)] if runs else []) for w in (2, 4)]
        reqs.append(RequestArms(prep, classic, arms))
    config = AbConfig(widths=(2, 4), prompt="@mixed", n=2, max_tokens=4)
    s = Session(config, [1, 2, 3], Arm(None, verdict=Verdict.CONTROL), [Arm(2), Arm(4)], requests=reqs,
                cancelled=True, reps=0)
    from blockwidth.engine.identity import compare

    for r in reqs:
        for a in r.arms:
            if a.runs:
                a.identity = compare(r.classic.runs[0].tokens, a.runs[0].tokens, pair.tokenizer)
    decide(s)
    return s


def test_a_cancelled_workload_lists_no_best_for_requests_it_did_not_run():
    lines = request_table(_workload_session(ran=1))
    rows = {line.split()[0]: line for line in lines if line.startswith("r")}
    assert rows["r0"].split()[-2] == "w4" or rows["r0"].split()[-2] == "w2"
    for rid in ("r1", "r2"):
        assert "classic" not in rows[rid] and rows[rid].split()[-2] == "-"
    assert "2 requests not measured on every arm (cancelled): no best there" in lines[-1]
    assert "classic on" not in lines[-1]


def test_a_costcurve_cancelled_before_any_repeat_judges_no_boundary():
    said = CostCurve(context=128, repeats=0, points=(), cancelled=True).boundary_lines()
    assert said == ["no repeat finished before the cancel: nothing measured, no kernel boundary judged"]
    assert not any("time grows smoothly" in line for line in said)


# ---- the pilot's estimate counts prefill ------------------------------------------------------

def test_the_plan_counts_prefill_and_the_repetitions_a_win_needs():
    p = pace.Pace(prefill_s=0.005, spec_prefill_s=0.006, decode_s=0.02, spec_decode_s=0.03, width=2)
    reqs = ((135, 32),) * 16
    shape = pace.Shape(reqs, widths=2, n=2, sequential=True, max_reps=6, max_seconds=150)
    plan = pace.plan(p, shape)
    run_s = 135 * 0.005 + 32 * 0.02  # prefill is half of a classic run here
    assert p.run_s(135, 32, False) == pytest.approx(run_s)
    one_pass = 16 * (run_s + 2 * p.run_s(135, 32, True))
    assert plan.pass_s == pytest.approx(one_pass * pace.OVERHEAD)
    assert plan.need == 3 and plan.reached == 2 and not plan.can_decide  # 150 s: no third pass
    raised = pace.plan(p, dataclasses.replace(shape, max_seconds=plan.seconds_for_need()))
    assert raised.can_decide
    assert pace.plan(p, dataclasses.replace(shape, n=3)).can_decide


def test_a_pilot_with_a_long_prompt_prices_each_request_at_its_own_length():
    """The demo pair over @mixed: 1.5 ms a prefill token at 26 tokens, 2.5 at 780; one pilot at
    the mean length priced every request alike and said 65 s for a run of 87 s."""
    short = pace.Pace(prefill_s=0.0015, spec_prefill_s=0.0018, decode_s=0.005, spec_decode_s=0.006,
                      width=2, at_tokens=60, new_tokens=8)
    p = dataclasses.replace(short, long_tokens=560, long_prefill_s=0.0025, long_decode_s=0.008)
    # at or under the pilot's own prompt, its rates; longer, what each token of context adds
    assert p.run_s(40, 32, False) == pytest.approx(short.run_s(40, 32, False))
    sp, sd = 0.001 / 500, 0.003 / 500
    # decode's context is the run's middle: 560 + 32 / 2 against the pilot's 60 + 8 / 2
    assert p.run_s(560, 32, False) == pytest.approx(560 * (0.0015 + sp * 500) + 32 * (0.005 + sd * 512))
    # a speculative arm's grows in proportion to its own rates
    assert p.run_s(560, 32, True) == pytest.approx(560 * (0.0018 + sp * 500 * 1.2) + 32 * (0.006 + sd * 512 * 1.2))
    reqs = ((30, 32),) * 10 + ((780, 32),) * 2
    shape = pace.Shape(reqs, widths=3, n=2)
    assert pace.plan(p, shape).first_s > 1.2 * pace.plan(short, shape).first_s
    # a long prompt that is cheaper per token (noise) never makes a longer request cheaper
    cheap = dataclasses.replace(short, long_tokens=560, long_prefill_s=0.001, long_decode_s=0.004)
    assert cheap.run_s(780, 32, False) == pytest.approx(short.run_s(780, 32, False))
    assert "after 560 prompt tokens classic 125, prefill 400" in p.describe()


def test_the_pilot_times_classic_on_the_longest_request_only_where_it_is_well_past_its_own():
    from blockwidth.engine import pace as engine_pace

    ids = list(range(40))
    assert engine_pace.long_prompt(ids, None) is None
    assert engine_pace.long_prompt(ids, list(range(50))) is None  # not 1.5x past: priced as is
    assert engine_pace.long_prompt(ids, list(range(2000))) == list(range(2000 - 512, 2000))
    assert engine_pace.long_prompt(ids, list(range(2000)), room=100) == list(range(1900, 2000))
    assert engine_pace.long_prompt(ids, list(range(2000)), room=50) is None  # no room past 1.5x
    pair = demo_pair()
    got = engine_pace.pilot(pair, ids, 2, longest=list(range(1, 300)))
    assert got.at_tokens == 40 and got.new_tokens == engine_pace.PILOT_TOKENS
    assert got.long_tokens == 299 and got.long_prefill_s > 0 and got.long_decode_s > 0
    assert engine_pace.pilot(pair, ids, 2).long_tokens == 0


def test_a_pilot_of_two_widths_prices_each_arm_at_its_own_width():
    """The demo pair over @mixed: w2 6.9 ms a token, w4 8.6, w8 13.0; every arm priced at w2's
    rate said 82 s for a console session of 105."""
    p = pace.Pace(prefill_s=0.001, spec_prefill_s=0.001, decode_s=0.005, spec_decode_s=0.007, width=2,
                  wide_width=8, wide_decode_s=0.013)
    assert p.spec_rate(2) == p.spec_rate(None) == p.spec_rate("auto") == 0.007
    assert p.spec_rate(4) == pytest.approx(0.009) and p.spec_rate(8) == pytest.approx(0.013)
    assert p.spec_rate(16) == pytest.approx(0.021)  # past the widest, the same slope
    assert p.run_s(10, 32, True, 4) == pytest.approx(10 * 0.001 + 32 * 0.009)
    # a wider width timed faster (noise, or acceptance): never below half the narrow one's rate
    odd = dataclasses.replace(p, wide_decode_s=0.001)
    assert odd.spec_rate(16) == pytest.approx(0.0035)
    shape = pace.Shape(((10, 32),), widths=2, n=3, arm_widths=(2, 8))
    alike = dataclasses.replace(shape, arm_widths=())
    assert pace.plan(p, shape).pass_s == pytest.approx(
        pace.OVERHEAD * (p.run_s(10, 32, False) + p.run_s(10, 32, True, 2) + p.run_s(10, 32, True, 8)))
    assert pace.plan(p, shape).pass_s > pace.plan(p, alike).pass_s
    assert "w2 143, w8 77;" in p.describe()
    from blockwidth.engine import pace as engine_pace

    got = engine_pace.pilot(demo_pair(), list(range(1, 30)), 2, wide=8)
    assert got.wide_width == 8 and got.wide_decode_s > 0
    assert engine_pace.pilot(demo_pair(), list(range(1, 30)), 2, wide=2).wide_width == 0


def test_what_follows_the_runs_is_priced_from_the_pilot():
    """SmolLM2 bf16 on the 2-core CPU, one prompt, widths 2 and 4, n 2: the estimate said 31 s
    and the session took 47; its exactness probe and cost curve (a third of it) were priced as
    7 % of the runs."""
    p = pace.Pace(prefill_s=0.04, spec_prefill_s=0.04, decode_s=0.125, spec_decode_s=0.14, width=2)
    shape = pace.Shape(((40, 16),), widths=2, n=2, arm_widths=(2, 4))
    probe = (40 * 0.04 + 4 * 0.125) + (40 * 0.04 + 6 * 0.125)  # each width: prefill, w + 2 steps
    curve = 60 * 0.04 + pace.CURVE_PASSES * (1 + 2 + 4) * 0.125  # past every request, rows 1, 2, 4
    assert pace.after_s(p, shape) == pytest.approx(probe + curve)
    runs = p.run_s(40, 16, False) * 4 + (p.run_s(40, 16, True, 2) + p.run_s(40, 16, True, 4)) * 3
    assert pace.plan(p, shape).first_s == pytest.approx(runs * pace.OVERHEAD + probe + curve)
    assert pace.after_s(p, dataclasses.replace(shape, arm_widths=())) == 0  # nothing to price it by
    assert pace.after_s(p, dataclasses.replace(shape, arm_widths=("auto",))) == 0


def test_the_time_left_is_the_pilots_price_scaled_by_the_runs_measured_so_far():
    """A pilot that priced the runs at half what they take: after the first runs the clock says
    twice the pilot's time left, and a long request's run counts for more than a short one's."""
    p = pace.Pace(prefill_s=0.001, spec_prefill_s=0.001, decode_s=0.01, spec_decode_s=0.01, width=2)
    reqs = ((100, 10), (1000, 10))  # prices: 0.2 s and 1.1 s a run
    shape = pace.Shape(reqs, widths=1, n=2)
    clock = pace.Clock(p, shape, ("short", "long"))
    assert clock.left_s(10, 0.0) is None  # nothing measured yet
    clock.started(0, 0.0, "short", "classic")
    assert clock.left_s(10, 0.1) is None
    clock.started(1, 0.4, "short", "w2")  # the first run took 0.4 s for a price of 0.2: twice
    clock.started(2, 0.8, "long", "classic")
    mean = (0.2 + 0.2 + 1.1 + 1.1) / 4
    expect = 2 * 1.1 + 7 * mean * 2 + (pace.OVERHEAD - 1) * 2 * (1.1 + 7 * mean)
    assert clock.left_s(10, 0.8) == pytest.approx(expect)
    assert clock.left_s(10, 1.8) == pytest.approx(expect - 1.0)  # the current run's time passes
    # an auto arm's controller calibrates before the first run: that time is not the runs'
    # (the review simulated 129 s said for 6 s left when it counted)
    late = pace.Clock(p, shape, ("short", "long"))
    late.started(0, 8.0, "short", "classic")
    late.started(1, 8.4, "short", "w2")
    late.started(2, 8.8, "long", "classic")
    assert late.left_s(10, 8.8) == pytest.approx(expect)
    # without a pilot every run costs alike: the mean run so far, times the runs left
    bare = pace.Clock(None, shape, ("short", "long"))
    bare.started(0, 0.0, "short", "classic")
    bare.started(1, 0.5, "short", "w2")
    assert bare.left_s(4, 0.5) == pytest.approx(0.5 + 2 * 0.5 + ((pace.OVERHEAD - 1) * 3 + pace.AFTER_SHARE * 4) * 0.5)
    # a single prompt's runs carry no request id: its one length prices them
    # and with the widths named, what follows the runs (the exactness probe, the cost curve) is
    # priced from the pilot too, and scaled alike
    single = pace.Shape(((1000, 10),), widths=1, n=1, arm_widths=(2,))
    one = pace.Clock(p, single)
    one.started(0, 0.0, "", "classic")
    one.started(1, 2.2, "", "w2")
    after = pace.after_s(p, single)
    assert after > 0
    assert one.left_s(2, 2.2) == pytest.approx(2.2 + (pace.OVERHEAD - 1) * 2 * 1.1 + 2 * after)
    # the overhead is the runs left's: at the last of many runs, it is that run's share alone
    many = pace.Clock(None, pace.Shape(reqs, widths=1, n=50), ("short", "long"))
    for run in range(200):
        many.started(run, run * 1.0, "short", "classic")
    assert many.left_s(200, 199.0) == pytest.approx(1.0 + (pace.OVERHEAD - 1) * 1.0 + pace.AFTER_SHARE * 200)


def test_a_sequential_sweep_prices_the_repetitions_it_adds(monkeypatch, capsys):
    """--sequential -n 1 goes on while undecided: the estimate said "about 6.6 min ... for its
    n 1" over a session that ran three repetitions (17 min). It now prices what it adds too;
    without --sequential it says only the n."""
    import threading

    from blockwidth.console import measure
    from blockwidth.engine import pace as engine_pace

    rates = pace.Pace(prefill_s=0.04, spec_prefill_s=0.04, decode_s=0.14, spec_decode_s=0.14, width=2)
    monkeypatch.setattr(engine_pace, "pilot", lambda *a, **k: rates)
    reqs = ((80, 56),) * 6
    config = AbConfig(widths=(2, 3, 4), prompt="", n=1, sequential=True, max_reps=12, max_seconds=1500)
    measure._say_pilot(None, [1], reqs, config, threading.Event())
    err = capsys.readouterr().err
    plan = pace.plan(rates, pace.Shape(reqs, 3, 1, True, 12, 1500, (2, 3, 4)))
    assert plan.reached == 3 and plan.can_decide and plan.reached_s == plan.need_s
    assert "for its n 1" in err and f"--sequential adds repetitions while undecided: 3 by about {pace.minutes(plan.need_s)}" in err
    assert "--max-reps 12 and --max-seconds 1500 allow" in err
    measure._say_pilot(None, [1], reqs, dataclasses.replace(config, sequential=False, n=3), threading.Event())
    err = capsys.readouterr().err
    assert "for its n 3" in err and "--sequential" not in err


# ---- one next step ----------------------------------------------------------------------------

def test_an_undecided_session_names_one_step_the_console_runs():
    s = fixture_session(outcome="undecided")
    from blockwidth.policy.verdict import Budget

    s.budget_out, s.rep_ends = Budget.SECONDS, [60.0, 121.0, 182.0]
    step = next_step(s)  # the seconds budget ran out: the budget its own repetitions ask for
    assert step is not None and step.field("secs") == 190 and "secs 190" in step.says
    assert "raise the secs field to 190" in headline(s, front=Front.CONSOLE).text  # the advice's figure
    assert next_step(fixture_session()) is None  # a win: nothing to run next
    assert next_step(fixture_session(cancelled=True)) is None
    drifted = fixture_session(drift=True)  # a drift noise would not make: the same fields, on a quiet host
    drifted.drift_chance = 2 / 12870  # what noise does with 8 runs a half: 2 / C(16, 8)
    assert drifted.drift and not drifted.drift_could_be_noise
    step = next_step(drifted)
    assert step is not None and step.fields == () and "runs it again as set" in step.says


# ---- careless pairs ---------------------------------------------------------------------------

def _say(capsys, *argv) -> tuple[int, str]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


def test_swapped_target_and_drafter_are_refused_in_one_line(capsys):
    from blockwidth.engine.pair import PairError, load_pair

    with pytest.raises(PairError) as e:
        load_pair(DEMO / "drafter", DEMO / "target-bf16")
    assert "wrong way round" in str(e.value) and "4.7M" in str(e.value) and "1.2M" in str(e.value)
    code, err = _say(capsys, "resolve", "--device", "cpu", "--target", str(DEMO / "drafter"),
                     "--draft", str(DEMO / "target-bf16"))
    assert code == 2 and len(err.splitlines()) == 1 and "--draft" in err and "wrong way round" in err
    # the 4-bit target is not counted smaller than it is: the demo pair as shipped passes
    code, _ = _say(capsys, "resolve", "--device", "cpu", "--demo-target", "4bit")
    assert code == 0


def test_kind_model_on_a_dflash_checkpoint_is_one_line(capsys):
    from blockwidth.engine.pair import PairError, load_pair

    with pytest.raises(PairError) as e:
        load_pair(DEMO / "target-bf16", DEMO / "dflash", "model")
    assert "is a dflash drafter" in e.value.message and "Received" not in str(e.value)
    code, err = _say(capsys, "resolve", "--device", "cpu", "--target", str(DEMO / "target-bf16"),
                     "--draft", str(DEMO / "dflash"), "--kind", "model")
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("blockwidth: error: --kind model:")


def test_a_config_of_nothing_is_refused_by_inspect_and_never_said_to_differ_from_none(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    code, err = _say(capsys, "inspect", str(empty))
    assert code == 2 and "describes no model" in err and len(err.splitlines()) == 1
    for args in (("--target", str(DEMO / "target-bf16"), "--draft", str(empty)),
                 ("--target", str(empty), "--draft", str(DEMO / "drafter"))):
        code, err = _say(capsys, "resolve", "--device", "cpu", "--kind", "model", *args)
        assert code == 2 and "None" not in err and "no vocab_size" in err and len(err.splitlines()) == 1


# ---- the demo 4-bit pair's first answer is the committed decline ------------------------------

def test_the_demo_4bit_pair_resolves_to_its_committed_decline(capsys):
    code = cli.main(["resolve", "--device", "cpu", "--demo-target", "4bit", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["decline"] and d["width"] is None and d["source"] == "measured-default"
    assert "cpu-demo-4bit-decline.json" in d["reason"]


def test_export_prints_no_other_machines_paths(capsys):
    for device in ("cpu", "cuda:9.0"):
        assert cli.main(["export", "--format", "mlx-lm", "--profile", str(ROOT / "examples/profile.toml"),
                         "--device", device]) == 0
        out = capsys.readouterr().out
        # the profile's own path is this checkout's; the records' are other machines'
        assert "/work/wt9" not in out and "h200" not in out.split("record")[0] and "TARGET" in out


def test_the_open_dialog_drops_the_drafter_for_lookup_and_marks_the_field_at_fault(tmp_path):
    import asyncio

    from textual.widgets import Input

    from blockwidth.console.app import BlockwidthApp, Options
    from blockwidth.console.screens import PairScreen

    async def go():
        app = BlockwidthApp(Options(target=str(DEMO / "target-bf16"), draft=str(DEMO / "drafter"), device="cpu",
                                    profile=str(tmp_path / "p.toml")), load=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("o")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, PairScreen)
            draft, kind = screen.query_one("#open-draft", Input), screen.query_one("#open-kind", Input)
            # a fresh open selects the pair in use: typing replaces it (a tryout's typing was
            # appended to the folder shown)
            target = screen.query_one("#open-target", Input)
            assert target.has_focus and target.value and target.selected_text == target.value
            # the field with the cursor is marked by a glyph, not by its colour alone
            def marked() -> list[str]:
                return [k for k in ("target", "draft", "kind")
                        if str(screen.query_one(f"#open-{k}-label").render()).startswith("▸")]

            assert marked() == ["target"]
            await pilot.press(*"/x")
            assert target.value == "/x"
            target.value = str(DEMO / "target-bf16")
            await pilot.press("tab", "tab", *"lookup")
            await pilot.pause()
            assert marked() == ["kind"]
            assert kind.value == "lookup" and draft.value == ""  # prompt lookup takes no checkpoint
            await pilot.press(*["backspace"] * 6, *"model")
            await pilot.pause()
            assert draft.value == str(DEMO / "drafter")  # another kind puts it back
            await pilot.press(*["backspace"] * 5, *"bogus", "enter")
            await pilot.pause()
            again = app.screen
            assert isinstance(again, PairScreen) and again is not screen
            bad = again.query_one("#open-kind", Input)
            assert bad.has_class("-bad") and bad.has_focus and bad.cursor_position == len(bad.value)
            assert bad.selection.is_empty  # nothing selected, as after an error in the A/B fields

    asyncio.run(go())


def test_a_workload_whose_requests_disagree_runs_next_on_the_requests_where_one_width_won(tmp_path):
    """The width best on most requests, on those requests alone: a workload of their own."""
    pair = demo_pair()
    out = pair.tokenizer.encode(" = []\n")[:4]
    reqs = []
    for i, (c, w) in enumerate([(40, 80), (40, 78), (40, 82), (40, 20), (40, 21)]):
        prep = Prepared(Request(f"r{i}", prompt=f"x{i}", line=i + 1), (1, 2, 3), 4, PROMPT)
        classic = Arm(None, [_run(None, c + d, out) for d in (0, 1, 2, 0.5)], verdict=Verdict.CONTROL)
        reqs.append(RequestArms(prep, classic, [Arm(2, [_run(2, w + d, out) for d in (0, 1, 2)])]))
    from blockwidth.engine.ab import _add_pass
    from blockwidth.engine.identity import compare

    s = Session(AbConfig(widths=(2,), prompt="@mixed", n=3, max_tokens=4, sequential=True), [1, 2, 3],
                Arm(None, verdict=Verdict.CONTROL), [Arm(2)], requests=reqs, reps=3, seed=1)
    for r in reqs:
        r.arms[0].identity = compare(r.classic.runs[0].tokens, r.arms[0].runs[0].tokens, pair.tokenizer)
    for _ in range(4):
        _add_pass(s, [None, 2])
    decide(s)
    assert s.arms[0].verdict is Verdict.UNDECIDED, s.arms[0].why
    step = next_step(s)
    assert step is not None and step.field("widths") == "2" and step.field("prompt") == "@"
    assert [r.id for r in step.requests] == ["r0", "r1", "r2"] and "3 requests where it was best" in step.says
    # the console writes them beside the records as JSONL, which the prompt field's @FILE reads
    from blockwidth.console.app import BlockwidthApp, Options
    from blockwidth.policy.workload import read

    app = BlockwidthApp(Options(record_dir=str(tmp_path / "rec")), load=False)
    written = read(str(app._write_requests(step.requests)))
    assert [r.id for r in written.requests] == ["r0", "r1", "r2"] and written.requests[1].prompt == "x1"


def test_the_next_steps_workload_runs_on_a_target_without_a_chat_template(tmp_path):
    """The built-in workload's chat requests reach a target without a chat template as mlx_lm.server's
    plain transcript; the next step's file (which is not built in, so its "messages" would be
    refused) carries that transcript as "prompt" text: the same ids, and it loads."""
    from blockwidth.console.app import BlockwidthApp, Options
    from blockwidth.engine.workload import TRANSCRIPT, prepare
    from blockwidth.policy.workload import builtin, read

    pair = demo_pair()
    assert not pair.tokenizer.has_chat_template
    mixed = builtin("mixed")
    chats = [r for r in mixed.requests if r.chat]
    assert chats
    app = BlockwidthApp(Options(record_dir=str(tmp_path / "rec")), load=False)
    app.pair = pair
    written = read(str(app._write_requests(chats)))
    assert [r.id for r in written.requests] == [r.id for r in chats] and not any(r.chat for r in written.requests)
    before = prepare(mixed, pair.tokenizer, 8)
    after = prepare(written, pair.tokenizer, 8)  # a file's messages would raise WorkloadError here
    assert [p.ids for p in after] == [p.ids for p in before if p.request.chat]
    assert {p.rendered for p in before if p.request.chat} == {TRANSCRIPT}


def _two_width_workload(rows, noise=(0, 1, 2), passes=3) -> Session:
    """A decided workload session of widths 2 and 4 on the demo pair's tokenizer: ``rows`` one
    (classic, w2, w4) tok/s per request, each arm's runs spread by ``noise`` (classic's closing
    run at +0.5), then ``passes`` passes added."""
    from blockwidth.engine.ab import _add_pass
    from blockwidth.engine.identity import compare

    pair = demo_pair()
    out = pair.tokenizer.encode(" = []\n")[:4]
    reqs = []
    for i, (c, w2, w4) in enumerate(rows):
        prep = Prepared(Request(f"r{i}", prompt=f"x{i}", line=i + 1), (1, 2, 3), 4, PROMPT)
        classic = Arm(None, [_run(None, c + d, out) for d in (*noise, 0.5)], verdict=Verdict.CONTROL)
        reqs.append(RequestArms(prep, classic, [Arm(2, [_run(2, w2 + d, out) for d in noise]),
                                                Arm(4, [_run(4, w4 + d, out) for d in noise])]))
    s = Session(AbConfig(widths=(2, 4), prompt="@mixed", n=3, max_tokens=4, sequential=True), [1, 2, 3],
                Arm(None, verdict=Verdict.CONTROL), [Arm(2), Arm(4)], requests=reqs, reps=3, seed=1)
    for r in reqs:
        for a in r.arms:
            a.identity = compare(r.classic.runs[0].tokens, a.runs[0].tokens, pair.tokenizer)
    for _ in range(passes):
        _add_pass(s, [None, 2, 4])
    decide(s)
    return s


def test_the_headline_names_the_width_the_next_step_runs(tmp_path):
    """Two widths whose requests disagree: the headline spoke of w2 (the first open width) while
    `n` ran w4 (the width best on most requests); now both name w4."""
    from blockwidth.console.outcome import more_runs

    # per request (classic, w2, w4) tok/s: w4 best on r0-r2, w2 on r3; both spread across 1
    s = _two_width_workload([(40, 44, 80), (40, 45, 78), (40, 43, 82), (40, 60, 20), (40, 22, 21)], passes=4)
    assert all(a.verdict is Verdict.UNDECIDED for a in s.arms), [a.why for a in s.arms]
    m = more_runs(s)
    step = next_step(s)
    assert m.spread is not None and m.spread[0] == "w4", m.spread
    assert step is not None and step.field("widths") == "4"


def test_a_sequential_sessions_bar_never_falls_back_when_repetitions_are_added():
    """The bar read 90 % at the end of the n repetitions, then 50 % at the first added one."""
    from types import SimpleNamespace

    from blockwidth.console.widgets.ab import sequential_stage

    req = SimpleNamespace(n=3, max_reps=6, max_seconds=360.0)
    planned = 40
    seen = []
    for run in range(planned):  # the planned runs, 5 s each
        e = SimpleNamespace(kind="arm", tokens=0, total=0, elapsed=run * 5.0, run=run, rep=1, closing=False)
        seen.append(sequential_stage(e, req, planned)[1])
    for rep in (4, 5, 6):  # the added repetitions
        e = SimpleNamespace(kind="arm", tokens=0, total=0, elapsed=200.0 + rep, run=planned + rep, rep=rep,
                            closing=False)
        seen.append(sequential_stage(e, req, planned)[1])
    assert seen == sorted(seen) and seen[-1] < 1.0, seen


def test_an_undecided_workload_names_the_widths_still_open():
    """The tryout read "intervals straddle the minimum gain" beside a w2 the table called slower:
    a workload with a width decided names the ones still open."""
    from types import SimpleNamespace

    from blockwidth.console.outcome import _open

    def arm(name, verdict):
        return SimpleNamespace(name=name, verdict=verdict, runs=[1])

    s = SimpleNamespace(single=False, arms=[arm("w2", Verdict.SLOWER), arm("w4", Verdict.UNDECIDED)])
    assert _open(s) == "w4's interval straddles the minimum gain"
    s.arms = [arm("w2", Verdict.UNDECIDED), arm("w4", Verdict.UNDECIDED)]
    assert _open(s) == "intervals straddle the minimum gain"


def test_a_width_whose_requests_agree_is_sent_more_repetitions_not_told_of_another_widths_spread():
    """SmolLM2 proofreading: w2 1.10x [1.02, 1.18], best on most requests, its requests alone
    [1.032, 1.174] (repetitions can still decide it), was told only that w3's requests disagree
    and 'cannot decide it'. The width best on most requests whose requests agree gets more
    repetitions; a spread is named only where it is that width's own."""
    from blockwidth.console.outcome import more_runs

    # per request (classic, w2, w4) tok/s: w2 1.10x on every request but noisy run to run; w4
    # best on one request only and spread across 1
    s = _two_width_workload([(40, 44, 30), (40, 44, 52), (40, 44, 31), (40, 44, 36), (40, 44, 38)],
                            noise=(-6, 0, 6))
    w2 = s.arms[0]
    assert w2.verdict is Verdict.UNDECIDED, w2.why
    m = more_runs(s)
    assert m.spread is None, m.spread
    step = next_step(s)
    assert step is None or step.field("widths") is None  # more repetitions, not a part of the workload


def test_a_winning_width_keeps_another_widths_spread_out_of_the_advice():
    """SmolLM2 spelling: w2 won, classic's opening and closing runs did not overlap (drift or
    noise), and the advice said w3's requests disagree so repetitions 'cannot decide it': what
    stood before the save was the drift, which repetitions do settle."""
    from blockwidth.console.outcome import more_runs

    s = _two_width_workload([(40, 60, 30), (40, 60, 52), (40, 61, 31), (40, 60, 56), (40, 59, 38)])
    assert [a.verdict for a in s.arms] == [Verdict.WINS, Verdict.UNDECIDED], [a.why for a in s.arms]
    assert more_runs(s).spread is None


def test_a_cancel_past_the_planned_runs_does_not_say_more_of_fewer():
    """Sequential adds repetitions past the planned runs: a tryout's cancel read "cancelled after
    197 of 160 measured runs"."""
    s = fixture_session(cancelled=True)
    done = sum(len(a.runs) for r in s.per_request for a in [r.classic, *r.arms])
    warmups = len(s.arms) + 1 if s.config.warmup else 0
    assert f"cancelled after {done} of {done + 5} measured runs" in headline(s, done + 5 + warmups).text
    assert f"cancelled after {done} measured runs:" in headline(s, done - 1 + warmups).text
