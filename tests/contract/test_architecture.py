"""The shape of the code: engines are plug-ins, and nothing outside them keeps engine or layer-kind knowledge."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import kvbudget
from kvbudget.cli import main
from kvbudget.engines import BUILT_IN, ENGINES, Allocation, CacheGroup, Capacity, Engine, EngineOptions, register
from kvbudget.engines.base import UsageGauge, group_layers, simple_capacity
from kvbudget.engines.metrics import first_gauge
from kvbudget.engines.scheduling.seq import Queues, SchedulerConfig, Seq, Step, commit
from kvbudget.engines.scheduling.setup import Planned, Setup, SimulationAsk, config_of
from kvbudget.model import spec as layer_specs
from kvbudget.model.spec import Attention, LayerSpec, ModelSpec
from kvbudget.simulation import Request, simulate

SRC = Path(kvbudget.__file__).parent


def _kinds(cls: type[LayerSpec]) -> tuple[str, ...]:
    """The kind names of every layer class under `cls` in model/spec.py that names its own."""
    return tuple(k for sub in cls.__subclasses__() for k in ((sub.kind,) if sub.__module__ == layer_specs.__name__
                                                            and "kind" in vars(sub) else ()) + _kinds(sub))


KINDS = _kinds(LayerSpec)


@dataclass(frozen=True)
class ToyEngine(Engine):
    """A made-up server: attention K and V in one byte per value, blocks of 4 tokens, every other kind skipped."""

    name: str = "toy"
    description: str = "a toy engine defined in a test"

    serves = True
    prompt_adds_bos = True
    usage = UsageGauge(path="/metrics", read=lambda text: first_gauge(text, ("toy:kv_usage",)),
                       promql="max by (instance) (toy:kv_usage)")

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        groups = group_layers(
            CacheGroup(kind=spec.kind, layers=1, bytes_per_token=sum(spec.kv_values(tp, model.name)),
                       detail="int8 K + V", block_size=4)
            if isinstance(spec, Attention) else None for spec in model.layers)
        return Allocation(engine=self.name, model=model.name, kv_dtype=kvbudget.get_dtype("int8"), tp=tp, groups=groups,
                          exact=False)

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        return simple_capacity(self.allocate(model, kv_dtype, tp, options), kv_memory, max_model_len, "toy pool")


class ToyScheduler(Queues):
    """Admits a waiting request whole when its prompt and output fit the free tokens; each step decodes every
    running request and prefills the admitted ones."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.free = config.num_blocks
        self.held: dict[int, int] = {}

    def usage(self) -> float:
        return 1 - self.free / self.cfg.num_blocks

    def memory(self) -> tuple[int, int, int]:
        states = sum(s.computed for s in self.running)
        return states, sum(self.held.values()) - states, 0

    def schedule(self) -> Step:
        scheduled = [(s, 1) for s in self.running]
        while self.waiting and self.waiting[0].prompt + self.waiting[0].end <= self.free:
            s = self.waiting.popleft()
            self.held[s.uid] = s.prompt + s.end
            self.free -= self.held[s.uid]
            self.running.append(s)
            scheduled.append((s, s.prompt))
        tokens, context = commit(scheduled)
        return Step(scheduled=tuple(scheduled), preempted=(), free_blocks=self.free, usage=self.usage(), tokens=tokens,
                    context=context)

    def _free(self, s: Seq) -> None:
        self.free += self.held.pop(s.uid)


class ToySimulator:
    """The toy's scheduler model: its token slots are the budget over its bytes per token."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def options(self, ask: SimulationAsk) -> EngineOptions:
        if ask.num_blocks is not None:
            raise kvbudget.KVBudgetError("num_blocks: the toy has no blocks", param="num_blocks")
        return EngineOptions()

    def sized_without_budget(self, ask: SimulationAsk) -> bool:
        return False

    def setup(self, ask: SimulationAsk, planned: Planned) -> Setup:
        return Setup(engine=self.engine.name, model=ask.model.name, num_blocks=planned.capacity.physical_token_slots,
                     block_size=1, kv_memory_bytes=planned.kv_memory, max_num_seqs=64, max_num_batched_tokens=4096,
                     max_model_len=planned.max_model_len, prefix_caching=False, long_prefill_token_threshold=0,
                     gpu=planned.gpu, time_model=planned.time_model, bytes_per_token=planned.allocation.bytes_per_token,
                     allocator="toy-reserve", allocation=planned.allocation, simulator=self)

    def scheduler(self, setup: Setup) -> Queues:
        return ToyScheduler(config_of(setup))

    def token_slots(self, setup: Setup) -> int:
        return setup.num_blocks

    def describe(self, setup: Setup, short: bool = False) -> str:
        return f"{setup.num_blocks:,} toy slots"

    def free_label(self, setup: Setup) -> str:
        return "free"


@dataclass(frozen=True)
class SimulatedToy(ToyEngine):
    name: str = "toy-sim"

    def simulator(self) -> ToySimulator:
        return ToySimulator(self)


@pytest.fixture
def toy(monkeypatch):
    engine = ToyEngine()
    import kvbudget.engines as engines

    monkeypatch.setattr("kvbudget.engines.ENGINES", engines.Registry())  # registration undone after the test

    register(engine)
    assert engines.ENGINES["toy"] is engine
    return engine


def test_an_engine_object_works_without_registration():
    model = kvbudget.load_model("llama-3.1-8b")  # 32 layers, 8 KV heads of 128 (its config.json)
    result = kvbudget.estimate(model, engine=ToyEngine(), context=[10])
    assert result.bytes_per_token == 32 * 8 * (128 + 128) * 1
    assert result.points[0].kv_bytes == 12 * result.bytes_per_token  # 10 tokens held in blocks of 4
    assert result.allocation.engine == "toy" and not result.allocation.exact


def test_a_registered_toy_engine_serves_every_consumer(toy, tmp_path, capsys):
    model = kvbudget.load_model("llama-3.1-8b")
    # the planner: the base serving defaults (a whole GPU, non-torch estimate), capacity from the toy pool
    p = kvbudget.plan(model, engine="toy", gpu_memory=80 * 2**30, weights=16 * 2**30, max_model_len=4096)
    assert p.engine is toy and p.capacity.max_concurrency == p.kv_memory_bytes / (4096 * 65536)
    # the command line, by name
    assert main(["estimate", "llama-3.1-8b", "--engine", "toy", "--json", "--context", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["points"][0]["kv_bytes"] == 4 * 65536
    # alerts on the engine's own gauge
    assert main(["alerts", "--engine", "toy", "--out", str(tmp_path)]) == 0
    assert "max by (instance) (toy:kv_usage) >= 0.7" in (tmp_path / "kvbudget-alerts.yaml").read_text()
    # the guard reads the toy's gauge
    from kvbudget.guard.signals import observed_usage

    assert observed_usage("toy", "toy:kv_usage 0.42\n") == 0.42
    # the token counter follows its BOS rule
    from kvbudget.tokens import PromptCounter

    counter = PromptCounter(None, approximate=True, engine="toy")
    assert counter.engine is toy and counter.engine.prompt_adds_bos


def test_a_registered_toy_engine_without_a_scheduler_model_is_refused_in_one_line(toy, capsys):
    model = kvbudget.load_model("llama-3.1-8b")
    with pytest.raises(kvbudget.KVBudgetError) as exc:
        simulate(model, [], engine="toy", gpu="L4")
    assert exc.value.param == "engine" and "toy" in str(exc.value)
    assert main(["simulate", "llama-3.1-8b", "--engine", "toy", "--gpu", "L4", "--rate", "1", "--requests", "3"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--engine toy" in err, err


def test_a_registered_toy_engine_with_a_scheduler_model_is_simulated(monkeypatch, capsys):
    import kvbudget.engines as engines

    monkeypatch.setattr("kvbudget.engines.ENGINES", engines.Registry())
    register(SimulatedToy())
    model = kvbudget.load_model("llama-3.1-8b")  # the toy keeps 32 x 8 x 256 = 65,536 bytes per token
    # 330 tokens of KV budget hold three requests of 100 + 10 tokens: ten arriving at once run three at a time
    work = [Request(arrival=0.0, prompt_tokens=100, output_tokens=10) for _ in range(10)]
    sim = simulate(model, work, engine="toy-sim", gpu="L4", kv_memory=330 * 65536, max_model_len=4096)
    assert sim.setup.engine == "toy-sim" and sim.setup.num_blocks == sim.setup.token_slots == 330
    assert sim.completed == 10 and sim.peak_running == 3 and sim.peak_waiting == 7
    assert sim.output_tokens == 100 and sim.peak_usage == 1.0
    # the one-line refusal of a setting the toy's scheduler model has no meaning for, before any heavy work
    with pytest.raises(kvbudget.KVBudgetError) as exc:
        simulate(model, work, engine="toy-sim", gpu="L4", num_blocks=10)
    assert exc.value.param == "num_blocks"
    # the command line, by name
    assert main(["simulate", "llama-3.1-8b", "--engine", "toy-sim", "--gpu", "L4", "--kv-memory", "256MiB",
                 "--max-model-len", "4096", "--rate", "2", "--requests", "20", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["completed"] == 20 and data["setup"]["allocator"] == "toy-reserve"
    assert main(["simulate", "llama-3.1-8b", "--engine", "toy-sim", "--gpu", "L4", "--kv-memory", "256MiB",
                 "--max-model-len", "4096", "--rate", "2", "--requests", "20"]) == 0
    assert "toy-sim (toy-reserve), L4: 256.00 MiB KV, 4,096 toy slots" in capsys.readouterr().out


def test_unknown_engine_is_a_one_line_error_everywhere(capsys):
    # `plan --engine foo` used to end in a KeyError traceback
    for argv in (["plan", "llama-3.1-8b", "--engine", "foo", "--gpu", "H100-80GB"],
                 ["estimate", "llama-3.1-8b", "--engine", "foo"],
                 ["compare", "llama-3.1-8b", "mistral-7b", "--engine", "foo"],
                 ["alerts", "--engine", "foo"]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "--engine" in err and "unknown engine 'foo'" in err, err
    with pytest.raises(kvbudget.KVBudgetError) as exc:
        kvbudget.plan(kvbudget.load_model("llama-3.1-8b"), engine="foo", gpu="H100-80GB")
    assert exc.value.param == "engine" and "--" not in str(exc.value)


def _python(path: Path) -> str:
    """Source without comments and docstring-only lines (what the code does, not what it says)."""
    return "\n".join(line.split("#")[0] for line in path.read_text().splitlines())


def _outside(*allowed: str) -> list[Path]:
    return [p for p in SRC.rglob("*.py") if not any(str(p.relative_to(SRC)).startswith(a) for a in allowed)]


def test_cache_kinds_dispatch_by_type():
    """Layer kinds and engines' cache kinds are told apart by class (isinstance, a method or a class attribute of
    the kind), as vLLM's spec_manager_map does, never by comparing a kind's name: nowhere outside model/ (which
    reads the configs' own layer-type strings), engines included."""
    spec_kinds = ("full", "sliding", "chunked", "mla", "mamba", "state")
    pattern = re.compile(r"\.kind\s*(==|!=|\bin\b)|(==|!=|\bin)\s*\(?\s*\"(" + "|".join(KINDS + spec_kinds) + ")\"")
    offenders = [f"{p.relative_to(SRC)}:{i}: {line.strip()}" for p in _outside("model/")
                 for i, line in enumerate(_python(p).splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_no_engine_name_is_compared_outside_the_engines():
    names = "|".join(re.escape(n) for n in ENGINES)
    pattern = re.compile(rf"(==|!=|\bin)\s*[\(\[{{]?\s*\"({names})\"|\"({names})\"\s*:")
    offenders = [f"{p.relative_to(SRC)}:{i}: {line.strip()}" for p in _outside("engines")
                 for i, line in enumerate(_python(p).splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_the_raw_config_is_read_only_inside_model():
    pattern = re.compile(r"(?<!kvbudget\.)\b(?!(args|ask|self|guard|gate|envoy)\.)\w+\.config\b(?!\s*import)")
    offenders = [f"{p.relative_to(SRC)}:{i}: {line.strip()}" for p in _outside("model")
                 for i, line in enumerate(_python(p).splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_library_errors_name_parameters_not_flags():
    """Messages raised by the library (outside the CLI) never name a command-line flag."""
    flag = re.compile(r"(Error|raise \w+)\((f?\"[^\"]*--[a-z][a-z-]+)")
    offenders = [f"{p.relative_to(SRC)}:{i}" for p in _outside("cli") for i, line in
                 enumerate(_python(p).splitlines(), 1) if flag.search(line)]
    assert offenders == []


def test_public_api():
    for name in ("load_model", "estimate", "plan", "compare", "count_prompt", "EngineOptions", "Capacity",
                 "KVBudgetError", "ConfigError", "UnsupportedArchitectureError", "EngineRuleError", "BudgetError",
                 "TokenizerError", "UpstreamConfigError", "Engine", "register"):
        assert name in kvbudget.__all__ and getattr(kvbudget, name).__doc__, name
    assert callable(kvbudget.estimate) and callable(kvbudget.plan)  # functions, not modules of the same name
    for error in ("ConfigError", "EngineRuleError", "BudgetError", "TokenizerError", "UpstreamConfigError"):
        assert issubclass(getattr(kvbudget, error), kvbudget.KVBudgetError)
    assert issubclass(kvbudget.UnsupportedArchitectureError, kvbudget.ConfigError)


# --- the map of the house ---------------------------------------------------------------------------------------

# the built-in engines' packages, their classes and the names of their instances, from the registry
ENGINE_PACKAGES = tuple(dict.fromkeys(module.rpartition(".")[2] for module, _ in BUILT_IN.values()))
ENGINE_CLASSES = tuple(dict.fromkeys([*(type(ENGINES[name]).__name__ for name in BUILT_IN),
                                      *(attr for _, attr in BUILT_IN.values())]))


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in SRC.rglob("*.py")}


def _imports(path: Path, typing: bool = False) -> set[str]:
    """Every kvbudget module `path` imports, at the top or inside a function (typing-only imports too with
    `typing`), and the packages above each (their __init__ runs first)."""
    import ast

    tree = ast.parse(path.read_text())
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not typing:
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], base]).strip(".")
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names)
            for name in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, name, None)
                if isinstance(inner, list):
                    visit(inner)

    visit(tree.body)
    me = _module(path)
    out = set()
    for name in found:
        parts = name.split(".")
        out.update(m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                   if m in MODULES and m != me and not me.startswith(m + "."))
    return out


def test_no_concrete_engine_is_imported_or_named_outside_its_package():
    """The simulator, planner, guard, check-log, web page and CLI ask engines through the registry and the
    capability protocols; only engines/ imports one or names its class (so no isinstance on one either)."""
    import ast

    offenders = []
    for path in _outside("engines"):
        for node in ast.walk(ast.parse(path.read_text())):
            named = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                     else None)
            imported = ([node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                        if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                        if isinstance(node, ast.Import) else [])
            if named in ENGINE_CLASSES or any(m.startswith(f"kvbudget.engines.{e}") for m in imported
                                              for e in ENGINE_PACKAGES):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []


def test_each_engine_package_keeps_to_itself():
    """One engine's package never imports another's."""
    offenders = [f"{name} imports {target}" for name, path in MODULES.items() for target in _imports(path)
                 for a in ENGINE_PACKAGES for b in ENGINE_PACKAGES
                 if a != b and name.startswith(f"kvbudget.engines.{a}") and target.startswith(f"kvbudget.engines.{b}")]
    assert offenders == []


# What sits above the engines: the use cases that ask them. An engine (its scheduler model and the scheduling kernel
# under engines/scheduling/ included) is asked by these and never asks them back.
ABOVE_THE_ENGINES = ("kvbudget.simulation", "kvbudget.planner", "kvbudget.guard",
                     "kvbudget.estimator", "kvbudget.comparison", "kvbudget.checklog", "kvbudget.offload",
                     "kvbudget.reuse", "kvbudget.tokens", "kvbudget.commands", "kvbudget.cli", "kvbudget.web",
                     "kvbudget.quality", "kvbudget.plot", "kvbudget.deploy.")


def test_engines_import_nothing_above_them():
    """engines/ (the scheduling kernel under engines/scheduling/ too) imports no runner, planner, guard or front
    end, typing-only imports included: the simulator's runner sits on the planner, the engines under both."""
    offenders = sorted(f"{name} imports {target}" for name, path in MODULES.items()
                       if name.startswith("kvbudget.engines") for target in _imports(path, typing=True)
                       if target.startswith(ABOVE_THE_ENGINES))
    assert offenders == []


def test_only_the_command_line_imports_the_command_line():
    """The web page and the guard call the library, not argparse (`__main__` runs the CLI)."""
    offenders = {f"{name} imports {target}" for name, path in MODULES.items() for target in _imports(path)
                 if target.startswith("kvbudget.cli") and not name.startswith("kvbudget.cli")
                 and name != "kvbudget.__main__"}
    offenders |= {f"{p.relative_to(SRC)} imports argparse" for p in _outside("cli")
                  if re.search(r"^\s*(import argparse|from argparse import)", _python(p), re.M)}
    assert offenders == set()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_import_cycles():
    """No module reaches itself through its imports of any kind: a function's imports included (those put off for
    start-up time still say which module depends on which), and typing-only ones (a type named is a dependency)."""
    assert _cycles({name: _imports(path, typing=True) for name, path in MODULES.items()}) == []


def test_the_cycle_finder_can_fail():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# Today's exceptions to "no module over 600 lines, no function over 80": this list may only shrink.
LONG_MODULES = {"model/config.py": 630}
LONG_FUNCTIONS: dict[str, int] = {}
MODULE_LINES, FUNCTION_LINES = 600, 80


def test_rooms_a_newcomer_can_read():
    import ast

    sizes = {}
    for path in SRC.rglob("*.py"):
        where = str(path.relative_to(SRC))
        sizes[where] = len(path.read_text().splitlines())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"{where}:{node.name}"
                sizes[key] = max(sizes.get(key, 0), (node.end_lineno or node.lineno) - node.lineno + 1)
    too_long = {k: n for k, n in sizes.items()
                if n > (LONG_FUNCTIONS.get(k, FUNCTION_LINES) if ":" in k else LONG_MODULES.get(k, MODULE_LINES))}
    assert too_long == {}, "split these, or (never) raise their allowance"
    fixed = [k for k in [*LONG_MODULES, *LONG_FUNCTIONS]
             if sizes.get(k, 0) <= (FUNCTION_LINES if ":" in k else MODULE_LINES)]
    assert fixed == [], "these are short enough now: drop them from the allow-list"


def test_the_public_names_are_one_list():
    """`__all__`, the lazy table that loads each name and the typing-only imports mypy reads name the same things
    (three spellings the linters need, held to one list here)."""
    import ast

    tree = ast.parse((SRC / "__init__.py").read_text())
    typed = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module and node.module.startswith("kvbudget") for a in node.names}
    lazy = {name for names in kvbudget._WHERE.values() for name in names}
    assert set(kvbudget.__all__) == lazy | {"catalog"} == typed


def test_wide_records_are_keyword_only():
    import ast

    wide: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
            if not isinstance(node, ast.ClassDef) or not any("dataclass" in d for d in decorators):
                continue
            fields = [b for b in node.body if isinstance(b, ast.AnnAssign) and "ClassVar" not in ast.unparse(b)]
            if len(fields) > 5 and not any("kw_only=True" in d for d in decorators):
                wide.setdefault(str(path.relative_to(SRC)), set()).add(node.name)
    assert wide == {}, "make wide records keyword-only"


def test_errors_carry_each_front_ends_words():
    """An error names parameters in the library's words; the command line (and the web page, which takes its
    names) renders the same error with flags, from the structure the message carries, not by rewriting text."""
    from kvbudget.commands import spelling
    from kvbudget.errors import named, spelled

    exc = kvbudget.KVBudgetError(f"tp: give {named('prompt_file')} or {named('rate', 'N')} "
                                 f"({named('prefix_caching', value=False)}); "
                                 f"{spelled('kvbudget.gpus.gpus()', 'kvbudget gpus')} lists them", param="tp")
    assert str(exc) == "tp: give prompt_file or rate (prefix_caching=False); kvbudget.gpus.gpus() lists them"
    assert spelling.message(exc) == ("--tp: give --prompt-file or --rate N (--no-prefix-caching); kvbudget gpus "
                                     "lists them")


def test_one_description_makes_the_flags_and_the_web_parameters(capsys):
    """Each command's request describes its options once: the CLI's flags are its fields, and the web page takes
    those the description opens to it, and nothing else."""

    from kvbudget.cli import build_parser
    from kvbudget.commands.options import options
    from kvbudget.web import api

    for command, request in api.REQUESTS.items():
        sub = next(a for a in build_parser(command)._actions if a.dest == "command").choices[command]
        dests = {a.dest for a in sub._actions if a.dest != "help"}
        assert dests == {n for n, _, _ in options(request)}, command
        assert set(api.OPTIONS[command]) == {n for n, _, o in options(request) if o.web and not o.positional}
    # the commands only the command line offers: their flags and arguments are their requests' options too
    from kvbudget.cli import MODULE_OF
    from kvbudget.commands.alerts import AlertsRequest
    from kvbudget.commands.catalog import CatalogRequest
    from kvbudget.commands.checklog import CheckLogRequest
    from kvbudget.commands.guard import GuardRequest
    from kvbudget.commands.quality import QualityRequest
    from kvbudget.commands.recommend import RecommendRequest
    from kvbudget.commands.tokens import TokensRequest
    from kvbudget.commands.web import WebRequest

    others = {"tokens": TokensRequest, "check-log": CheckLogRequest, "quality": QualityRequest, "guard": GuardRequest,
              "alerts": AlertsRequest, "web": WebRequest, "models": CatalogRequest, "gpus": CatalogRequest,
              "traces": CatalogRequest, "recommend": RecommendRequest}
    assert set(others) | set(api.REQUESTS) == set(MODULE_OF)  # every command has its request
    for command, request in others.items():
        sub = next(a for a in build_parser(command)._actions if a.dest == "command").choices[command]
        dests = {a.dest for a in sub._actions if a.dest != "help"}
        assert dests == {n for n, _, _ in options(request)}, command
    # the same bad request, in the same words, on both front ends
    assert main(["simulate", "llama-3.1-8b", "--gpu", "L4"]) == 2
    said = capsys.readouterr().err.removeprefix("kvbudget: error: ").strip()
    from starlette.testclient import TestClient

    from kvbudget.web.app import create_app

    body = TestClient(create_app()).get("/api/simulate?model=llama-3.1-8b&gpu=L4").json()
    assert body["error"] == said == ("simulate: give --trace FILE, --request-log FILE or --rate N (synthetic "
                                     "arrivals)")


def test_tests_are_laid_out_like_the_source():
    """Unit tests per package (tests/unit/<package>/ names a package of the source), front-end contracts, checks
    against outside data (corpus), and the real engines and tools behind markers; no test file loose at the top."""
    tests = Path(__file__).resolve().parents[1]
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    assert {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))} == {
        "unit", "contract", "corpus", "engines", "browser", "cluster", "data"}
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in (tests / "unit").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= packages, folders - packages
