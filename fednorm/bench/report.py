"""The benchmark run behind ``fednorm bench`` / ``make bench``: plan, sections, report.

:class:`BenchPlan` says what to measure (the full plan at the paper preset, or
:meth:`BenchPlan.quick`, a smoke run at the test preset); :func:`run_plan` runs its
sections in order under one progress bar; :func:`render` turns them into Markdown (a
header with machine, date, command and load, links to the plots, a summary against the
paper, then every section).  ``bench/RESULTS.md`` is this report alone, regenerated whole;
the history of the speed work is docs/PERFORMANCE.md.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fednorm.bench import (
    cases,
    communication,
    decryption_noise,
    kth,
    micro,
    noise,
    plain,
    precision,
    protocols,
    study,
    threads,
    zscore,
)
from fednorm.bench.inputs import col_context
from fednorm.bench.measure import (
    Section,
    environment,
    fmt_or_dash,
    git_state,
    load_average,
    log,
    met,
    now,
    reporting,
    sci,
    step,
    wait_for_quiet,
)
from fednorm.bench.paper import PAPER_TABLE_V_S
from fednorm.engine.errors import InputError
from fednorm.training.progress import Progress

GENERATED_MARKER = "# PPF benchmark report"
SECTIONS = ("micro", "totals", "epsilon", "scaling", "precision", "zscore", "noise",
            "flooding", "plain", "threads", "study")
"""Section names for ``--sections``, in the order they run (the headline ones first: the
report is written after each section, so a run cut short keeps them)."""


@dataclass(frozen=True)
class BenchPlan:
    """What one benchmark run measures. The defaults are ``make bench``'s full run."""

    preset: str = "paper"
    sections: tuple[str, ...] = SECTIONS
    parties: int = 10  # Table V / VI
    repeats: int = 2  # runs per Table V case and z-score mode
    micro_parties: tuple[int, ...] = (10, 20, 30, 50)
    micro_repeats: int = 2
    fast_repeats: int = 7
    slow_repeats: int = 3
    cases: tuple[str, ...] = tuple(cases.CASES)  # Table V; each runs beside its `versus`
    zscore_modes: tuple[str, ...] = ("flooded", "inverse", "reveal", "max_count")
    precision_seeds: int = 2  # z-score
    costly_seeds: int = 1  # MinMax and robust (a robust run at ε = 1e-6 is minutes)
    precision_modes: tuple[str, ...] = ("flooded", "inverse", "reveal")
    epsilons: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
    # Up to 50: at P = 100 the paper's z-score, every role in this one process, went past
    # the machine's 24 GB (2026-11-29: killed by the OOM killer, replayed and on trust
    # alike; 7.3 GB at 2cc8014), which ends the whole run.  P = 50 peaks at 6.3-6.8 GB.
    scaling_parties: tuple[int, ...] = (3, 10, 25, 50)
    # Benchmark cases; the paper's z-score on trust, as the paper measures it (replayed,
    # every simulated party also repeats the server's steps in this one process).
    scaling_methods: tuple[str, ...] = ("zscore", "zscore_paper_on_trust")
    plain_shapes: tuple[tuple[int, int], ...] = plain.SHAPES
    thread_layouts: tuple[tuple[int, int], ...] = threads.LAYOUTS
    study_grid: study.GridRequest = study.FULL
    study_jobs: int = 2
    study_max_rounds: int | None = None  # smoke runs only
    quiet_below: float = 0.5
    max_wait: float = 0.0
    command: str = ""
    quick: bool = False

    @classmethod
    def quick_plan(cls, **changes: object) -> BenchPlan:
        """A smoke run at the test preset (insecure ring 2^14): a few minutes."""
        base = cls(preset="test", parties=3, repeats=1, micro_parties=(3, 6), micro_repeats=1,
                   fast_repeats=3, slow_repeats=2, zscore_modes=("flooded",),
                   precision_seeds=1, costly_seeds=1, precision_modes=("flooded",),
                   epsilons=(1e-1, 1e-3),
                   scaling_parties=(2, 4), scaling_methods=("zscore",),
                   plain_shapes=plain.QUICK_SHAPES, thread_layouts=((1, 1), (2, 1)),
                   study_grid=study.QUICK, study_jobs=1, study_max_rounds=3, quick=True)
        return replace(base, **changes)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.sections) - set(SECTIONS))
        if unknown:
            raise InputError(f"unknown bench sections {unknown}; choose from {list(SECTIONS)}")
        for name, values in (("parties", (self.parties,)), ("micro parties", self.micro_parties),
                             ("scaling parties", self.scaling_parties)):
            if not values or min(values) < 2:
                raise InputError(f"{name} must be at least 2, got {values}")
        if min(self.repeats, self.micro_repeats, self.fast_repeats, self.slow_repeats,
               self.precision_seeds, self.costly_seeds) < 1:
            raise InputError("repeats must be at least 1")
        cases.check_cases([*self.cases, *self.scaling_methods])
        strange = sorted((set(self.zscore_modes) | set(self.precision_modes))
                         - set(zscore.MODES))
        if strange:
            raise InputError(f"unknown z-score modes {strange}; choose from "
                             f"{list(zscore.MODES)}")
        if not self.epsilons or min(self.epsilons) <= 0:
            raise InputError(f"epsilons must be positive, got {self.epsilons}")

    def steps(self) -> int:
        """Units of work the progress bar counts (runs, or one per P / per section)."""
        table_v = sum(map(cases.available, cases.with_counterparts(self.cases)))
        scaled = len(self.scaling_parties) * sum(map(cases.available, self.scaling_methods))
        costly = sum(cases.available(name) for name, _, _ in precision.PRECISION_CASES)
        count = {
            "micro": len(self.micro_parties) + 1,
            "totals": self.repeats * table_v,
            "zscore": self.repeats * len(self.zscore_modes),
            "precision": 2 * (self.precision_seeds * len(self.precision_modes)
                              + self.costly_seeds * costly),
            "epsilon": len(self.epsilons),
            "scaling": scaled,
            "noise": 1,
            "flooding": 1,
            "plain": len(self.plain_shapes) * len(plain.METHODS),
            "threads": self.repeats * len(self.thread_layouts),
            "study": 1,
        }
        return sum(count[s] for s in self.sections) + 1  # + communication


@dataclass
class BenchRun:
    """The sections of one run, the records behind the communication section, timing."""

    plan: BenchPlan
    sections: dict[str, Section] = field(default_factory=dict)
    records: list[protocols.RunRecord] = field(default_factory=list)
    started: str = ""
    load_before: str = ""
    load_after: str = ""
    seconds: float = 0.0
    done: list[str] = field(default_factory=list)  # sections finished so far
    fednorm: str = ""  # commit and uncommitted changes at the start (the code measured)

    @property
    def complete(self) -> bool:
        return len(self.done) == len(self.plan.sections)


def run_plan(plan: BenchPlan, progress: Progress | None = None,
             after_section: Callable[[BenchRun], None] | None = None) -> BenchRun:
    """Run every section of ``plan`` in order (the context is built before any timing).

    ``after_section`` sees the run after each section (with the communication section
    brought up to date), so a report can be written as it grows: an interrupted run
    still leaves what it measured.
    """
    col_context(plan.preset)
    start, t0 = now()
    run = BenchRun(plan, started=start.strftime("%Y-%m-%d %H:%M UTC"),
                   load_before=load_average(), fednorm=git_state())
    with reporting(progress or Progress(plan.steps())):
        for name in plan.sections:
            seen = wait_for_quiet(plan.quiet_below, plan.max_wait)
            for section in _run_section(name, plan, run):
                section.meta["load average (1/5/15 min) before"] = seen
                run.sections[section.key] = section
            run.done.append(name)
            if run.records:
                run.sections["communication"] = communication.communication(
                    run.records, plan.preset, plan.parties, plan.command)
            run.load_after, run.seconds = load_average(), time.perf_counter() - t0
            if after_section:
                after_section(run)
        step("communication", 0.0)
    return run


def _run_section(name: str, plan: BenchPlan, run: BenchRun) -> list[Section]:
    """One section; a failure becomes a section that says so, and the run goes on (one
    broken protocol must not cost the hour of measurements around it)."""
    started, t0 = now()
    try:
        return _RUNNERS[name](plan, run)
    except Exception as exc:  # reported in the output, not swallowed
        log(f"section {name} failed: {type(exc).__name__}: {exc}")
        note = (f"**Failed** after {time.perf_counter() - t0:.0f} s: `{type(exc).__name__}: "
                f"{exc}`. The sections before and after it are unaffected.")
        return [Section(f"failed_{name}", f"Section `{name}` failed", [], [], [note],
                        {"date": started.strftime("%Y-%m-%d %H:%M UTC")})]


def _micro(plan: BenchPlan, run: BenchRun) -> list[Section]:
    table = micro.table_iv(plan.micro_parties, plan.micro_repeats, plan.fast_repeats,
                           plan.slow_repeats, plan.preset, plan.command)
    t = time.perf_counter()
    sizes = micro.wire_sizes(plan.preset, command=plan.command)
    step("wire sizes", time.perf_counter() - t)
    return [table, sizes]


def _totals(plan: BenchPlan, run: BenchRun) -> list[Section]:
    section, records = protocols.totals(plan.cases, plan.repeats, plan.parties,
                                        plan.preset, plan.command)
    run.records += records
    return [section]


def _zscore(plan: BenchPlan, run: BenchRun) -> list[Section]:
    return [zscore.table_v(plan.repeats, plan.parties, plan.preset, plan.command,
                           plan.zscore_modes)]


def _precision(plan: BenchPlan, run: BenchRun) -> list[Section]:
    return [zscore.table_vi(plan.precision_seeds, plan.parties, plan.preset, plan.command,
                            plan.precision_modes),
            precision.precision(plan.costly_seeds, plan.parties, plan.preset, plan.command)]


def _epsilon(plan: BenchPlan, run: BenchRun) -> list[Section]:
    section, records = kth.kth_vs_epsilon(plan.epsilons, plan.parties, plan.preset,
                                                command=plan.command)
    run.records += records
    return [section]


def _scaling(plan: BenchPlan, run: BenchRun) -> list[Section]:
    section, records = protocols.scaling(plan.scaling_methods, plan.scaling_parties,
                                         plan.preset, command=plan.command)
    run.records += records
    return [section]


def _noise(plan: BenchPlan, run: BenchRun) -> list[Section]:
    t = time.perf_counter()
    section = noise.noise_probe(plan.preset, plan.parties, plan.command)
    step("noise probe", time.perf_counter() - t)
    return [section]


def _flooding(plan: BenchPlan, run: BenchRun) -> list[Section]:
    t = time.perf_counter()
    section = decryption_noise.flooding_calibration(plan.preset, plan.parties, plan.command)
    step("flooding calibration", time.perf_counter() - t)
    return [section]


def _plain(plan: BenchPlan, run: BenchRun) -> list[Section]:
    return [plain.plain_vs_sklearn(plan.plain_shapes, plan.parties, plan.fast_repeats,
                                   plan.command)]


def _threads(plan: BenchPlan, run: BenchRun) -> list[Section]:
    return [threads.threads_layout("zscore", plan.parties, plan.preset, plan.repeats,
                                   plan.command, plan.thread_layouts)]


def _study(plan: BenchPlan, run: BenchRun) -> list[Section]:
    return [study.study_grid(plan.study_grid, plan.study_jobs, plan.command,
                             plan.study_max_rounds)]


_RUNNERS: dict[str, Callable[[BenchPlan, BenchRun], list[Section]]] = {
    "micro": _micro, "totals": _totals, "zscore": _zscore, "precision": _precision,
    "epsilon": _epsilon, "scaling": _scaling, "noise": _noise, "flooding": _flooding,
    "plain": _plain,
    "threads": _threads, "study": _study,
}


# -- Markdown -----------------------------------------------------------------------------
_SHOWN_IN_HEADER = ("command", "machine", "versions", "fednorm")


def render(run: BenchRun, plots: dict[str, str] | None = None, relative_to: str = ".") -> str:
    """The generated report: header, plots, summary, every section (level-2 headings)."""
    env = environment()
    plan = run.plan
    lines = [GENERATED_MARKER, "",
             f"- **command**: `{plan.command}`" + (" (quick smoke run: test preset, "
                                                  "insecure, not comparable)" if plan.quick
                                                  else ""),
             f"- **date**: {run.started}, {run.seconds / 60:.1f} min in all",
             f"- **machine**: {env['machine']}, {env['cpu']}, {env['cores']} cores, "
             f"{env['ram']} RAM, {env['os']}",
             f"- **versions**: Python {env['python']}, openfhe {env['openfhe']}, numpy "
             f"{env['numpy']}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}",
             f"- **fednorm**: {run.fednorm} (at the start: the code measured)",
             f"- **load average (1/5/15 min)**: {run.load_before} before, {run.load_after} "
             "after. Each section lists the load it started under, and each row the "
             "*foreign load*: cores kept busy by other processes while it ran (2 cores here;"
             " one busy foreign core slows OpenFHE 2–5x).",
             f"- **preset**: `{plan.preset}`; timings are medians over the runs listed.", ""]
    if not run.complete:
        todo = [s for s in plan.sections if s not in run.done]
        lines += [f"**Incomplete run**: sections {', '.join(todo)} were not measured (the "
                  "run was written after each section and stopped before them).", ""]
    if plots:
        lines += ["## Plots", ""]
        for caption, path in plots.items():
            lines += [f"![{caption}]({os.path.relpath(path, relative_to)})", ""]
    lines += [summary(run.sections, plan.parties), ""]
    # Communication last: it covers the runs of every section before it.
    ordered = sorted(run.sections.items(), key=lambda item: item[0] == "communication")
    lines += [section.markdown(level=2, skip=_SHOWN_IN_HEADER) for _, section in ordered]
    return "\n".join(lines).rstrip() + "\n"


def summary(sections: dict[str, Section], table_parties: int = 10) -> str:
    """Headline figures against the paper and the issues' targets."""
    out = ["## Summary", "", "| what | ours | paper | target | met |", "|---|---:|---:|---:|---|"]
    for r in sections.get("totals", Section("", "", [], [])).rows:
        paper = "–" if math.isnan(r["paper_s"]) else f"{r['paper_s']:.0f} s"
        target = "–" if math.isnan(r["target_s"]) else f"≤ {r['target_s']:.1f} s"
        out.append(f"| Table V {r['name']}, P={r['parties']} | {r['median_s']:.1f} s | "
                   f"{paper} | {target} | {met(r['median_s'], r['target_s'])} |")
        if not math.isnan(r["x_faster"]):
            goal = r["speedup_target"]
            out.append(f"| Table V {r['name']} beside `{r['versus']}`, same run | "
                       f"{r['x_faster']:.1f}x faster | – | "
                       + ("– | – |" if math.isnan(goal) else
                          f"≥ {goal:g}x | {'yes' if r['x_faster'] >= goal else '**no**'} |"))
    for r in sections.get("table_vi", Section("", "", [], [])).rows:
        out.append(f"| Table VI {r['param']}, {r['data']}-valued, {r['mode']} | "
                   f"{sci(r['max_rel_error'])} | {sci(r['paper'])} | "
                   f"≤ {sci(r['target'])} | {met(r['max_rel_error'], r['target'])} |")
    for r in sections.get("precision", Section("", "", [], [])).rows:
        target = "= numpy" if r["target"] == "numpy" else "≤ paper"
        out.append(f"| Table VI {r['param']}, {r['data']}-valued, {r['name']} | "
                   f"{sci(r['max_rel_error'])} (abs. {sci(r['max_abs_error'])}) | "
                   f"{sci(r['paper'])} | {target} | {r['met']} |")
    eps = sections.get("kth_epsilon", Section("", "", [], [])).rows
    if len(eps) >= 2:
        lo, hi = max(eps, key=lambda r: r["epsilon"]), min(eps, key=lambda r: r["epsilon"])
        out.append(f"| k-th search, ε {lo['epsilon']:g} → {hi['epsilon']:g} | "
                   f"{lo['kth_s']:.1f} → {hi['kth_s']:.1f} s, {lo['rounds']} → {hi['rounds']} "
                   "rounds | linear in log(1/ε) | – | – |")
    for r in sections.get("study", Section("", "", [], [])).rows:
        out.append(f"| study grid, {r['runs']} runs, --jobs {r['jobs']} | "
                   f"{r['wall_s'] / 60:.1f} min | – | ≤ {r['target_s'] / 60:.0f} min | "
                   f"{met(r['wall_s'], r['target_s'])} |")
    for r in sections.get("communication", Section("", "", [], [])).rows:
        if r["parties"] == 10 and cases.base_method(r["method"]) in PAPER_TABLE_V_S:
            formula = fmt_or_dash(r["paper_formula"] / 1e6, ".0f")
            out.append(f"| bytes {cases.display_name(r['method'])}, P=10, after key setup "
                       f"| {r['bytes_protocol'] / 1e6:.0f} MB | {formula} MB (formula) | – | – |")
    return "\n".join(out) + "\n"
