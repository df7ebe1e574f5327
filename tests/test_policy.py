"""policy/ as pure decisions: the verdict rules, the check statuses and the run bounds on
values, without an engine, a console or a file."""

import pytest

from blockwidth.policy import bounds
from blockwidth.policy.verdict import ArmFacts, RefusalKind, Verdict, decide, refusal, saveable


def test_the_verdict_rules_on_plain_numbers():
    classic = [100, 101, 102, 101]
    arms = [ArmFacts("w2", 2, (110, 111, 112), 3, 0, True), ArmFacts("w4", 4, (120, 125, 130), 3, 1, True),
            ArmFacts("w8", 8, (90, 91, 92), 3, 0, True), ArmFacts("w16", 16, (150, 151, 152), 3, 0, False),
            ArmFacts("w6", 6, (), 0, 0, True)]
    d = decide(classic, arms, reps=3, more="more")
    assert [v for v, _ in d.verdicts] == [Verdict.WINS, Verdict.WINS, Verdict.SLOWER,
                                          Verdict.FASTER_DIFFERS, Verdict.NOT_MEASURED]
    assert d.recommendation == 4 and d.decision == "width 4 beats classic" and not d.drift.drifted
    assert "drafter declined 1 rounds" in d.verdicts[1][1]
    blind = decide(classic, arms[:2], reps=3, blind=True)
    assert {v for v, _ in blind.verdicts} == {Verdict.UNDECIDED} and blind.decision == "undecided"
    stopped = decide(classic, arms[:3], reps=1, cancelled=True)
    assert stopped.decision == "cancelled" and stopped.recommendation is None
    assert {v for v, _ in stopped.verdicts} == {Verdict.UNDECIDED}
    moved = decide([100, 100, 100, 100, 120, 120, 120, 120], arms[:1], more="more")
    assert moved.drift.drifted and moved.drift.chance == pytest.approx(2 / 70)


@pytest.mark.parametrize("state,kind", [
    (dict(cancelled=True, recommendation=4, verdicts=[Verdict.WINS]), RefusalKind.CANCELLED),
    (dict(drifted=True, recommendation=4, verdicts=[Verdict.WINS]), RefusalKind.DRIFT),
    (dict(recommendation=4, verdicts=[Verdict.WINS, Verdict.UNDECIDED]), None),
    (dict(verdicts=[Verdict.UNDECIDED, Verdict.SLOWER]), RefusalKind.UNDECIDED),
    (dict(verdicts=[Verdict.FASTER_DIFFERS, Verdict.UNDECIDED]), RefusalKind.DIFFERS),
    (dict(verdicts=[Verdict.NOT_MEASURED]), RefusalKind.NOT_MEASURED),
    (dict(verdicts=[Verdict.SLOWER, Verdict.NOT_MEASURED]), None),  # a decline
])
def test_one_rule_says_what_can_be_saved(state, kind):
    full = {**dict(cancelled=False, drifted=False, recommendation=None), **state}
    assert refusal(**full) is kind and saveable(**full) is (kind is None)
    if kind is RefusalKind.DIFFERS:
        assert refusal(**full, allow_nonidentical=True) is None


def test_run_bounds():
    assert bounds.context_problem(1024, 1024) is None
    assert "context of 1024" in bounds.context_problem(1024, 1025)
    assert "states no context length" in bounds.context_problem(None, bounds.UNKNOWN_CONTEXT + 1)
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    need = bounds.memory_need(cfg, 1000)
    assert need == 2 * 2 * 4 * 16 * 1000 * 2 + 4 * 1000 * 1000 * 4
    assert bounds.memory_need({"num_hidden_layers": "2"}, 10) is None
    assert bounds.memory_problem(need, 4 * need) is None and "over half" in bounds.memory_problem(need, need)


POLICY = sorted(p.stem for p in (__import__("pathlib").Path(__file__).parents[1] / "policy").glob("*.py")
                if p.stem != "__init__")


def test_policy_imports_no_engine_console_mlx_textual_or_locking():
    """Every policy module, imported in a fresh interpreter, pulls in none of the outside:
    no MLX, no NVML, no Textual, no file locking, no engine or console module."""
    import json
    import subprocess
    import sys

    code = ("import sys, json\n" + "".join(f"import policy.{m}\n" for m in POLICY)
            + "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                       text=True).stdout)
    banned = ("mlx", "mlx_lm", "pynvml", "textual", "fcntl", "engine", "console", "tomlkit")
    assert [m for m in loaded if m.split(".")[0] in banned] == []
    assert len(POLICY) >= 10  # the scan below reads what was imported here


def test_policy_source_writes_no_file_and_probes_nothing():
    """A source scan for the ways a module writes or locks a file, and for imports a function
    could make late (MLX, NVML, Textual, the engine, the console): policy reads (bounded) and
    decides; the engine probes, the console writes the profile and the records."""
    import re
    from pathlib import Path

    writes = re.compile(r"open\([^)]*['\"][wax+]b?['\"]|os\.(replace|rename|link|unlink|remove|fsync|"
                        r"fchmod|mkdir|makedirs)\b|\.(write_text|write_bytes|mkdir|unlink|touch)\(|"
                        r"\bfcntl\b|\bflock\b|mkstemp|NamedTemporaryFile|O_CREAT|O_WRONLY|O_RDWR|"
                        r"shutil\.|^\s*(import|from) (mlx|mlx_lm|pynvml|textual|fcntl|engine|console)\b")
    root = Path(__file__).parents[1] / "policy"
    found = [f"{p.name}:{i}: {line.strip()}" for p in sorted(root.glob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if writes.search(line)]
    assert found == []


def test_every_error_the_product_raises_has_one_base_and_each_front_end_words_its_input():
    """One base (policy.errors.BlockwidthError: message, input name, exit code) for every
    exception class the product defines; nothing re-wraps one into InputError to rename it."""
    import ast
    import importlib
    import inspect
    from pathlib import Path

    from blockwidth.console.inputs import CLI_NAMES, CONSOLE_NAMES, pair_paths
    from blockwidth.console.profile_file import ProfileBusy
    from blockwidth.policy.errors import BlockwidthError, ExitCode, InputError

    root = Path(__file__).parents[1]
    mods = sorted("blockwidth." + ".".join(p.relative_to(root).with_suffix("").parts) for d in ("policy", "engine", "console")
                  for p in (root / d).rglob("*.py") if p.name != "__init__.py" and "demo/pair" not in str(p))
    classes = {}
    for m in mods:
        for name, obj in inspect.getmembers(importlib.import_module(m), inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == m:
                classes[f"{m}.{name}"] = obj
    assert len(classes) >= 15, sorted(classes)
    assert [n for n, c in classes.items() if not issubclass(c, BlockwidthError)] == []
    # an `except <one of ours> as e:` whose body raises InputError: a re-wrap (a foreign error,
    # shlex's ValueError say, may still be turned into an InputError at its door)
    # (IntegerError is the integer parser's answer, which each caller words as its input's problem)
    ours = {c.__name__ for c in classes.values()} - {"IntegerError"}
    rewraps = []
    for d in ("console", "engine", "policy"):
        for p in (root / d).rglob("*.py"):
            for h in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                if not isinstance(h, ast.ExceptHandler) or h.type is None:
                    continue
                caught = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")
                          for n in ast.walk(h.type) if isinstance(n, (ast.Name, ast.Attribute))}
                raised = [r for r in ast.walk(h) if isinstance(r, ast.Raise) and isinstance(r.exc, ast.Call)
                          and getattr(r.exc.func, "id", getattr(r.exc.func, "attr", "")) == "InputError"]
                if caught & ours and raised:
                    rewraps.append(f"{p.name}:{h.lineno}")
    assert rewraps == []

    with pytest.raises(InputError) as e:
        pair_paths("/nope/target", None)
    assert e.value.input_name == "target" and e.value.exit_code is ExitCode.USAGE
    assert e.value.say(CLI_NAMES) == "--target /nope/target: no such file or directory"
    assert e.value.say(CONSOLE_NAMES) == "target field /nope/target: no such file or directory"
    assert ProfileBusy("p.toml", ["locked"]).exit_code is ExitCode.CHECK_FAILED
