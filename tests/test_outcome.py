"""Session -> profile entry or refusal, and the headline: pure functions on fixed sessions."""

import dataclasses

from console.outcome import Front, PairFacts, Refusal, RefusalKind, Tone, headline, in_effect_note, profile_entry
from engine.ab import Budget, Verdict, decide
from policy.device import parse_device_spec
from policy.profile import Override
from tests.states import demo_pair, fixture_session

CPU = parse_device_spec("cpu")


def _entry(session, **kw):
    pair = demo_pair()
    return profile_entry(session, PairFacts(pair.kind, pair.quantization, pair.pair_id), CPU, mlx="0.32.4",
                         measured_at="2026-01-01T00:00:00Z", record="r.json", **kw)


def test_a_win_becomes_an_entry_with_its_evidence():
    e = _entry(fixture_session())
    assert isinstance(e, Override) and e.width == 4 and not e.decline and e.byte_identical
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
    assert "drift or noise, too few runs to tell" in h.text
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
    assert isinstance(kept, Override) and not kept.byte_identical


def test_a_lost_width_in_effect_is_flagged():
    s = fixture_session()
    assert in_effect_note(s, 4)[1] is Tone.GOOD
    assert in_effect_note(s, 8)[1] is Tone.BAD and "SLOWER" in in_effect_note(s, 8)[0]
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
    assert isinstance(e, Override) and e.decline and e.width is None
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


def test_an_undecided_sequential_session_names_the_budget_that_ran_out_not_the_box_that_is_on():
    """The console said "raise n, or turn on sequential" with its sequential box already on:
    the remedy there is the budget that ended it (the console's budget is fixed: n buys more,
    since n repetitions always run in full), or widths closer than this host can separate."""
    s = _undecided()  # sequential, as the console runs it: at most 12 repetitions, 60 s
    assert s.config.sequential and s.reps == 3
    s.budget_out = Budget.SECONDS
    r = _entry(s)
    assert isinstance(r, Refusal) and r.kind is RefusalKind.UNDECIDED
    console, cli = r.say(Front.CONSOLE), r.say(Front.CLI)
    assert console == ("undecided: ranges overlap; sequential mode ran out of time after 3 repetitions "
                       "(its budget is 60 s); raise n above 3 (n repetitions always run in full), or the "
                       "widths may be too close to separate on this host")
    assert cli == ("undecided: ranges overlap; sequential mode ran out of time after 3 repetitions "
                   "(--max-seconds 60); raise --max-seconds, or the widths may be too close to separate "
                   "on this host")
    s.budget_out, s.reps = Budget.REPS, 12
    console, cli = _entry(s).say(Front.CONSOLE), _entry(s).say(Front.CLI)
    assert "ran out of repetitions after 12 (its budget is 12); raise n above 12" in console
    assert "ran out of repetitions after 12 (--max-reps 12); raise --max-reps," in cli
    s.budget_out = None  # stopped with budget left (a closing classic run unsettled a width)
    assert "sequential mode stopped after 12 repetitions; raise n above 12" in _entry(s).say(Front.CONSOLE)
    assert "sequential mode stopped after 12 repetitions; raise -n above 12" in _entry(s).say(Front.CLI)
    for front in Front:
        said = _entry(s).say(front)
        assert "turn on sequential" not in said and "--sequential" not in said
    assert "--" not in _entry(s).say(Front.CONSOLE)


def test_an_undecided_fixed_n_session_still_says_more_repetitions_or_sequential():
    r = _entry(_undecided(sequential=False))
    assert r.say(Front.CONSOLE) == ("undecided: ranges overlap; run more repetitions "
                                    "(raise n, or turn on sequential)")
    assert r.say(Front.CLI) == "undecided: ranges overlap; run more repetitions (-n, or --sequential)"


def test_an_undecided_session_is_not_saveable_anywhere():
    """One rule (policy.verdict.saveable): the record said "saveable": true for an undecided
    session (no drift, not cancelled) while save refused it. The record, what sweep --json
    prints (the record's decision), the headline and save now agree, and a record written
    before the rule reads by its verdicts, not by its stored flag."""
    from engine import record
    from policy.verdict import RefusalKind as Kind

    host = {"device": {"backend": "cpu"}, "mlx": "0.32.4"}
    for s, kind in ((_undecided(), Kind.UNDECIDED), (fixture_session(), None),
                    (fixture_session(drift=True), Kind.DRIFT),
                    (fixture_session(cancelled=True), Kind.CANCELLED)):
        rec = record.build(s, demo_pair(), host)
        entry = _entry(s)
        assert s.saveable is (kind is None) is rec["decision"]["saveable"] is headline(s).saveable
        assert record.refusal(rec) is kind
        assert isinstance(entry, Override) if kind is None else entry.kind is kind
    old = record.build(_undecided(), demo_pair(), host)
    old["decision"]["saveable"] = True  # as the old rule wrote it
    assert record.refusal(old) is Kind.UNDECIDED
    differs = fixture_session()
    for arm in differs.arms:
        arm.identity = type(arm.identity)(**{**arm.identity.to_dict(), "identical_ids": False,
                                             "first_divergence": 3})
    decide(differs)
    assert not differs.saveable and record.refusal(record.build(differs, demo_pair(), host)) is Kind.DIFFERS
