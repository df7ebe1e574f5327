"""The console in each state, from fixed figures, for snapshot tests and the README screenshots.

Sessions here are built from fixed timings (no clock, no host, no record path of the
day) on the real demo pair's tokenizer, then judged by the real ``engine.ab.decide``:
so a snapshot changes only when what the console draws changes.
"""

from __future__ import annotations

from pathlib import Path

from blockwidth.console.app import BlockwidthApp, Options, Phase
from blockwidth.console.request import SessionRequest
from blockwidth.engine.ab import AbConfig, Arm, Event, Session, Verdict, decide
from blockwidth.engine.decode import DecodeRun, Round
from blockwidth.engine.demo.prompts import DEFAULT_PROMPT
from blockwidth.engine.identity import Exactness, compare

TOKENS = 16
BUDGET_S = 180  # the fixture sessions' seconds budget: a fixed figure, not the console's default
CONTINUATION = " = []\n\n    def push(self, item):\n        self.items.append(item)\n"
STATES = ("idle", "running", "done", "cancelled", "failed", "refused",
          # and the screen after a save, a stale session, a sequential session's budget
          # bar, the cost-curve stage, a pair that did not load, a saved decline, and the y
          # dialog for each drafter kind, an undecided session, an unloaded pair and a decline
          "saved", "stale", "sequential", "costcurve", "unloaded", "decline",
          "y-model", "y-lookup", "y-dflash", "y-mtp", "y-undecided", "y-unloaded", "y-decline",
          # a sequential session's n repetitions (the bar counts their runs), the same with its
          # seconds budget spent before they end, and an undecided end with measured advice
          "sequential-n", "sequential-spent", "undecided",
          # the pilot's warning before a session that cannot reach a win (n 2, 60 s)
          "warned")

# The pilot's rates for the "warned" state (fixed: seconds per token on a busy 2-core CPU).
PACE = dict(prefill_s=0.005, spec_prefill_s=0.006, decode_s=0.025, spec_decode_s=0.03, width=2)

# A load failure as the pair panel shows one (a message engine.pair gives, fixed here).
LOAD_ERROR = ("target {}: mlx-lm cannot load it (ValueError: Received 2 parameters not in model: "
              "lm_head.biases, lm_head.scales)")


def demo_pair(kind: str | None = None):
    from tests.conftest import demo_pair as shared

    return shared(kind)


def _run(width: int | None, tok_s: float, tokens: list[int]) -> DecodeRun:
    decode_s = len(tokens) / tok_s
    rounds = [] if width is None else [Round(width - 1, width - 1 - (width > 2), width - (width > 2), 0.001, 0.004, 0.0)] * 6
    return DecodeRun(width, list(tokens), 20, 0.05, decode_s, rounds)


def fixture_session(*, drift: bool = False, cancelled: bool = False, outcome: str = "win") -> Session:
    """Widths 2, 4, 8 against classic, n = 3, 16 tokens: w4 wins, w8 is slower.

    ``drift``: classic's closing runs do not overlap its opening ones (nothing can be saved).
    ``cancelled``: stopped after the first repetition. ``outcome``: ``win`` (as above),
    ``decline`` (every width slower) or ``undecided`` (every width overlaps classic)."""
    pair = demo_pair()
    tok = pair.tokenizer
    ids = tok.encode(DEFAULT_PROMPT)
    out = tok.encode(CONTINUATION)[:TOKENS]
    config = AbConfig(widths=(2, 4, 8), prompt=DEFAULT_PROMPT, n=3, max_tokens=TOKENS, sequential=True,
                      max_seconds=BUDGET_S)
    classic_tok_s = [40.0, 41.0, 52.0, 53.0] if drift else [40.0, 41.5, 42.0, 40.5]
    speeds = {"win": {2: [44.0, 45.0, 46.0], 4: [60.0, 62.0, 63.0], 8: [30.0, 31.0, 33.0]},
              "decline": {2: [35.0, 36.0, 37.0], 4: [30.0, 31.0, 32.0], 8: [20.0, 21.0, 22.0]},
              "undecided": {2: [39.0, 41.0, 44.0], 4: [38.0, 42.0, 45.0], 8: [36.0, 40.5, 43.0]}}[outcome]
    reps = 1 if cancelled else 3
    classic = Arm(None, [_run(None, v, out) for v in classic_tok_s[:reps + (0 if cancelled else 1)]],
                  verdict=Verdict.CONTROL)
    arms = [Arm(w, [_run(w, v, out) for v in speeds[w][:reps]]) for w in config.widths]
    s = Session(config, ids, classic, arms, reps=reps, elapsed_s=42.0, cancelled=cancelled, started_at=0.0)
    for arm in arms:
        arm.identity = compare(classic.runs[0].tokens, arm.runs[0].tokens, tok)
    if not cancelled:
        s.exactness = {w: Exactness(w, True, 0.0, (True,) * w) for w in config.widths}
        s.predicted = {2: 1.12, 4: 1.41, 8: 0.83}
        s.predicted_best = 4
    decide(s)
    return s


def request_of(session: Session) -> SessionRequest:
    c = session.config
    return SessionRequest(c.widths, c.n, c.max_tokens, c.prompt, c.sequential, c.max_reps, c.max_seconds)


def make_app(tmp_path: Path) -> BlockwidthApp:
    """An app that loads nothing by itself: ``enter`` puts it in a state."""
    app = BlockwidthApp(Options(device="cpu", profile=str(tmp_path / "p.toml"),
                                record_dir=str(tmp_path / "rec")), load=False)
    app.animation_level = "none"  # a tab underline caught mid-slide is not a state
    return app


def _fields(app: BlockwidthApp, session: Session) -> None:
    app.query_one("#widths").value = ",".join(map(str, session.config.widths))
    app.query_one("#n").value = str(session.config.n)
    app.query_one("#tokens").value = str(session.config.max_tokens)
    from blockwidth.console.widgets.ab import AbTab

    app.query_one(AbTab).set_prompt(session.config.prompt)  # the fixture's one prompt, not the default workload


def demo_link() -> Path:
    """The demo pair through a link at one fixed absolute path: the y dialog prints absolute
    paths, and a snapshot must not depend on where the checkout is."""
    import tempfile

    from blockwidth.engine import demo

    link = Path(tempfile.gettempdir()) / "blockwidth-demo-pair"
    real = demo.target("bf16").parent
    if not (link.is_symlink() and link.resolve() == real.resolve()):
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(real, target_is_directory=True)
    return link


async def _resolve(app: BlockwidthApp, pilot, kind: str | None = None, linked: bool = False) -> None:
    from blockwidth.console.inputs import resolution

    o = app.options
    target = draft = None
    if linked:
        link = demo_link()
        target = str(link / "target-bf16")
        draft = None if kind == "lookup" else str(link / {"dflash": "dflash", "mtp": "mtp"}.get(kind, "drafter"))
    app.set_resolution(*resolution(target=target, draft=draft, kind=kind, flag=None, device=o.device,
                                   profile=o.profile, profile_missing_ok=True))
    await pilot.pause()


async def _save(app: BlockwidthApp, pilot, scope: str = "g") -> None:
    """s, then the scope dialog's key, then the re-resolution the save starts (as the worker
    would post it, with the named device the state was resolved for)."""
    await pilot.press("s")
    await pilot.pause()
    await pilot.press(scope)
    # The dialog's dismissal starts the save's thread worker a message later; on a loaded host
    # one wait could return before the worker existed, and the state was snapshotted resolved
    # from the per-kind default instead of the entry just saved. Wait for the profile file and
    # for the Saved message's handling (it starts a re-resolution worker of its own, which once
    # finished after the one below and the snapshot caught it half-way, under CI's load).
    profile = Path(app.options.profile)
    for _ in range(500):
        await app.workers.wait_for_complete()
        await pilot.pause()
        state = app.session_state
        if profile.is_file() and state is not None and state.saved is not None:
            break
    else:
        raise AssertionError(f"the save never wrote {profile}")
    await app.workers.wait_for_complete()
    await _resolve(app, pilot, linked=app._linked)


async def enter(app: BlockwidthApp, pilot, state: str) -> None:
    """Put a mounted app in ``state`` (one of STATES), through the app's own methods and keys."""
    kind = {"y-lookup": "lookup", "y-dflash": "dflash", "y-mtp": "mtp"}.get(state)
    app._linked = state.startswith("y-")  # type: ignore[attr-defined]
    await _resolve(app, pilot, kind, linked=state.startswith("y-"))
    if state in ("unloaded", "y-unloaded"):
        # as the pair worker's failure sets it; the demo pair's folder named from the checkout's
        # root, so the snapshot does not hold where this checkout happens to be
        target = Path(app.paths.target)
        root = Path(__file__).resolve().parent.parent
        shown = target.relative_to(root) if target.is_relative_to(root) else target
        app.load_error = LOAD_ERROR.format(shown)
        app._show_phase(Phase.LOAD_FAILED, "why: above; o opens another pair")
    else:
        app.set_pair(demo_pair(kind))
    await pilot.pause()
    if state == "warned":
        from blockwidth.policy.pace import Pace

        app.pace = Pace(**PACE)
        app.query_one("#n").value, app.query_one("#secs").value = "2", "60"
        await pilot.pause()
        await pilot.press("a")  # the default @mixed, n 2 within 60 s: the warning, before any run
        await pilot.pause()
        return
    if state in ("idle", "unloaded", "y-model", "y-lookup", "y-dflash", "y-mtp", "y-unloaded"):
        if state.startswith("y-"):
            await pilot.press("y")
        await pilot.pause()
        return
    outcome = {"decline": "decline", "y-decline": "decline", "y-undecided": "undecided",
               "undecided": "undecided"}.get(state, "win")
    session = fixture_session(drift=state == "refused", cancelled=state == "cancelled", outcome=outcome)
    if state == "undecided":
        # the seconds budget ran out after three repetitions, the last ending past it: the advice
        # is computed from the repetitions' own times
        from blockwidth.policy.verdict import Budget

        session.budget_out, session.rep_ends = Budget.SECONDS, [60.0, 121.0, 182.0]
    _fields(app, session)
    await pilot.pause()
    req = request_of(session)
    app.begin(req, session.config.planned_runs)
    if state == "running":
        # the first repetition has ended (its table so far) and the second is under way, each run
        # taking 2 s (the time left is said from them)
        from blockwidth.console.app import AbEvent
        from blockwidth.console.widgets.ab import running_rows

        planned = session.config.planned_runs
        for run in range(10):
            if run == 8:
                first = fixture_session(cancelled=True)  # one repetition's runs
                width = app.res.engine_width if app.res is not None else None
                app.on_ab_event(AbEvent(Event("rep", rep=1, elapsed=16.0, session=first),
                                        running_rows(first, width)))
            arm = ("classic", "w2", "w4", "w8")[run % 4]
            app.on_ab_event(_event(Event("arm", arm, run // 4, 0, TOKENS, run=run, runs=planned,
                                         elapsed=2.0 * run)))
        app.on_ab_event(_event(Event("progress", "w4", 2, 8, TOKENS, run=9, runs=planned, elapsed=19.0)))
    elif state == "sequential":
        # the sixth repetition of a sequential session, 31 s into its 60 s budget: the bar
        # is the budget, not a total that grows
        app.on_ab_event(_event(Event("progress", "w4", 6, 8, TOKENS, run=25, runs=26, elapsed=31.0)))
    elif state == "sequential-n":
        # the second of n 3 repetitions: the bar counts the planned runs (17), not the budget
        app.on_ab_event(_event(Event("progress", "w4", 2, 8, TOKENS, run=9, runs=17, elapsed=20.0)))
    elif state == "sequential-spent":
        # the n repetitions outlast the seconds budget: said in words, the bar still on the runs
        app.on_ab_event(_event(Event("progress", "w8", 3, 4, TOKENS, run=14, runs=17, elapsed=BUDGET_S + 8)))
    elif state == "costcurve":
        app.on_ab_event(_event(Event("phase", "w8", run=2, runs=3, phase="exactness")))
        app.on_ab_event(_event(Event("phase", run=0, runs=4, phase="costcurve")))
    elif state == "failed":
        from blockwidth.engine.decode import DecodeError

        app.session_failed(DecodeError("prompt of 30 tokens + 64 new tokens exceeds the target's context of 64"))
    else:
        app.show_session(session, Path("session-fixture.json"), [], request=req)
        await pilot.pause()
        if state == "refused":
            await pilot.press("s")
            await app.workers.wait_for_complete()
        elif state in ("saved", "decline", "y-decline"):
            await _save(app, pilot)
        elif state == "stale":
            app.query_one("#n").value = "5"  # as typed: the shown results are for n 3
        if state in ("y-decline", "y-undecided"):
            await pilot.pause()
            await pilot.press("y")
    await pilot.pause()


def _event(e: Event):
    from blockwidth.console.app import AbEvent

    return AbEvent(e)
