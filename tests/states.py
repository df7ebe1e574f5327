"""The console in each state, from fixed figures, for snapshot tests and the README screenshots.

Sessions here are built from fixed timings (no clock, no host, no record path of the
day) on the real demo pair's tokenizer, then judged by the real ``engine.ab.decide``:
so a snapshot changes only when what the console draws changes.
"""

from __future__ import annotations

from pathlib import Path

from console.app import BUDGET_S, BlockwidthApp, Options
from console.request import SessionRequest
from engine.ab import AbConfig, Arm, Event, Session, Verdict, decide
from engine.decode import DecodeRun, Round
from engine.demo.prompts import DEFAULT_PROMPT
from engine.identity import Exactness, compare

TOKENS = 16
CONTINUATION = " = []\n\n    def push(self, item):\n        self.items.append(item)\n"
STATES = ("idle", "running", "done", "cancelled", "failed", "refused")

_PAIR = None


def demo_pair():
    global _PAIR
    if _PAIR is None:
        from console.inputs import pair_paths
        from engine.pair import load_pair

        paths = pair_paths(None, None)
        _PAIR = load_pair(paths.target, paths.drafter)
    return _PAIR


def _run(width: int | None, tok_s: float, tokens: list[int]) -> DecodeRun:
    decode_s = len(tokens) / tok_s
    rounds = [] if width is None else [Round(width - 1, width - 1 - (width > 2), width - (width > 2), 0.001, 0.004, 0.0)] * 6
    return DecodeRun(width, list(tokens), 20, 0.05, decode_s, rounds)


def fixture_session(*, drift: bool = False, cancelled: bool = False) -> Session:
    """Widths 2, 4, 8 against classic, n = 3, 16 tokens: w4 wins, w8 is slower.

    ``drift``: classic's closing runs do not overlap its opening ones (nothing can be saved).
    ``cancelled``: stopped after the first repetition."""
    pair = demo_pair()
    tok = pair.tokenizer
    ids = tok.encode(DEFAULT_PROMPT)
    out = tok.encode(CONTINUATION)[:TOKENS]
    config = AbConfig(widths=(2, 4, 8), prompt=DEFAULT_PROMPT, n=3, max_tokens=TOKENS, sequential=True,
                      max_seconds=BUDGET_S)
    classic_tok_s = [40.0, 41.0, 52.0, 53.0] if drift else [40.0, 41.5, 42.0, 40.5]
    speeds = {2: [44.0, 45.0, 46.0], 4: [60.0, 62.0, 63.0], 8: [30.0, 31.0, 33.0]}
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
    from console.widgets.ab import AbTab

    app.query_one(AbTab).set_prompt(session.config.prompt)  # the fixture's one prompt, not the default workload


async def enter(app: BlockwidthApp, pilot, state: str) -> None:
    """Put a mounted app in ``state`` (one of STATES), through the app's own methods."""
    from console.inputs import resolution

    o = app.options
    app.set_resolution(*resolution(target=None, draft=None, kind=None, flag=None, device=o.device,
                                   profile=o.profile, profile_missing_ok=True))
    app.set_pair(demo_pair())
    await pilot.pause()
    if state == "idle":
        return
    session = fixture_session(drift=state == "refused", cancelled=state == "cancelled")
    _fields(app, session)
    await pilot.pause()
    req = request_of(session)
    app.begin(req, session.config.planned_runs)
    if state == "running":
        app.on_ab_event(_event(Event("progress", "w4", 2, 8, TOKENS, run=9, runs=session.config.planned_runs)))
    elif state == "failed":
        from engine.decode import DecodeError

        app.session_failed(DecodeError("prompt of 30 tokens + 64 new tokens exceeds the target's context of 64"))
    else:
        app.show_session(session, Path("session-fixture.json"), [], request=req)
        if state == "refused":
            await pilot.pause()
            await pilot.press("s")
            await app.workers.wait_for_complete()
    await pilot.pause()


def _event(e: Event):
    from console.app import AbEvent

    return AbEvent(e)
