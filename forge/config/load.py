"""The one load pipeline every command uses: files and folders in, typed models, plans and every
problem out. Nothing here prints; callers render Problems (`file::$.path: message`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

from forge.config import checks
from forge.config.files import shown, walk_configs
from forge.config.models import Contract, NodeDescription
from forge.config.parse import ParsedFile, parse_file
from forge.config.plan import CardPlan, plan_card
from forge.config.registry import Registry
from forge.errors import ConfigError, ForgeError, Problem

PathLike = Union[str, Path]


@dataclass
class LoadedSet:
    """Everything found in a set of paths. Plugin rules (forge_validation_rules) receive this."""

    nodes: dict[str, NodeDescription] = field(default_factory=dict)
    contracts: dict[str, Contract] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    plans: dict[str, list[CardPlan]] = field(default_factory=dict)  # node name -> per card
    # node name -> its contracts
    node_contracts: dict[str, dict[str, Contract]] = field(default_factory=dict)
    files_checked: int = 0

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity != "error"]

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class LoadedDescription:
    """A valid node with its contracts and per-card plans, ready to provision."""

    node: NodeDescription
    contracts: dict[str, Contract]
    plans: list[CardPlan]
    warnings: list[Problem]


class _Session:
    """Loads each file once (by real path) and remembers what came from where."""

    def __init__(self, reg: Registry):
        self.reg = reg
        self.parsed: dict[str, ParsedFile] = {}       # realpath -> parsed file, in load order
        self.extra: list[Problem] = []                # folder-level notes and cross-file findings

    def file(self, path: Path) -> ParsedFile:
        key = os.path.realpath(path)
        if key not in self.parsed:
            self.parsed[key] = parse_file(path, self.reg)
        return self.parsed[key]

    def expand(self, path: Path) -> list[Path]:
        """Files of a path: the path itself, or the YAML files below a folder."""
        if not path.is_dir():
            return [path]
        files, notes = walk_configs(path)
        self.extra += [Problem(shown(p), "$", msg, sev) for p, sev, msg in notes]
        if not files:
            self.extra.append(Problem(shown(path), "$", "no .yaml/.yml files in this folder"))
        return files

    def node_contract_files(self, pf: ParsedFile) -> tuple[list[Path], bool]:
        """The files a node's `contracts:` names (a folder or a list), relative to the node file,
        and whether every named path exists. (Read from the file as written when the node itself has
        errors.)"""
        named = pf.model.contracts if pf.model is not None else pf.contracts_named
        base = pf.path.parent
        entries = [(named, "$.contracts")] if isinstance(named, str) else \
            [(entry, f"$.contracts[{i}]") for i, entry in enumerate(named)]
        out: list[Path] = []
        complete = True
        for rel, where in entries:
            target = base / rel
            if not target.exists():
                # name the path as resolved: a copied node file's relative `contracts:` points
                # somewhere else
                pf.add(where, f"{rel!r} (relative to the node file's folder: "
                              f"{os.path.abspath(target)}) does not exist")
                complete = False
            elif target.is_dir():
                files, notes = walk_configs(target)
                self.extra += [Problem(shown(p), "$", msg, sev) for p, sev, msg in notes]
                if not files:
                    pf.add(where, f"no .yaml/.yml files in {shown(target)}")
                    complete = False
                out += files
            else:
                out.append(target)
        return out, complete


def _cross_file_duplicates(files: list[ParsedFile]) -> list[Problem]:
    first: dict[tuple[str, str], ParsedFile] = {}
    out = []
    for pf in files:
        if pf.model is None:
            continue
        key = (pf.kind, pf.name)
        if key in first:
            what = "node" if pf.kind == "node" else "contract"
            out.append(Problem(pf.display, f"$.{pf.kind}", f"{what} name {pf.name!r} is also used "
                                                           "by "
                               f"{first[key].display}"))
        else:
            first[key] = pf
    return out


def _link_node(s: _Session, pf: ParsedFile, out: LoadedSet) -> None:
    node: NodeDescription = pf.model
    contracts: dict[str, Contract] = {}
    broken: set[str] = set()
    files, complete = s.node_contract_files(pf)
    for path in files:
        cf = s.file(path)
        if cf.kind == "contract" and cf.model is not None:
            contracts.setdefault(cf.model.contract, cf.model)
        elif cf.kind == "contract" and cf.name:
            broken.add(cf.name)        # its own problems say why; do not repeat them on the card
        elif cf.kind is None:
            # unreadable: its file name is the best guess at its contract name
            broken.add(path.stem)
    if not complete:  # the missing path is reported; unknown names would only repeat it
        broken |= {card.engine for card in node.cards if card.engine not in contracts}
    plans = [
        plan_card(card, contracts[card.engine]) for card in node.cards if card.engine in contracts
    ]
    pf.problems += checks.check_node(node, pf.display, contracts, plans, broken)
    if node.node not in out.nodes:
        out.nodes[node.node] = node
        out.node_contracts[node.node] = contracts
        out.plans[node.node] = plans


def load_paths(
    paths: Sequence[PathLike], *, strict: bool = False, registry: Optional[Registry] = None
) -> LoadedSet:
    """Load node descriptions and engine contracts from files and folders, with every check."""
    if registry is None:
        from forge.config.registry import from_plugins

        registry = from_plugins()
    s = _Session(registry)
    for p in paths:
        for f in s.expand(Path(p)):
            s.file(f)
    out = LoadedSet()
    for pf in list(s.parsed.values()):
        if pf.kind == "node" and pf.model is not None:
            _link_node(s, pf, out)       # may load more files (the node's contracts)
        elif pf.kind == "node" and pf.contracts_named is not None:
            # A node with errors still names its contracts: check them in this pass too, so one run
            # of `forge validate` reports every independent problem (fixing the node does not reveal
            # new ones).
            for path in s.node_contract_files(pf)[0]:
                s.file(path)
    files = list(s.parsed.values())
    for pf in files:
        if pf.kind == "contract" and pf.model is not None:
            pf.problems += checks.check_contract(
                pf.model,
                pf.display,
                contract_rules=registry.contract_rules,
                artifact_checks=registry.artifact_checks,
            )
            out.contracts.setdefault(pf.model.contract, pf.model)
    problems = _cross_file_duplicates(files) + s.extra
    for pf in files:
        problems += pf.problems
    out.problems = problems
    out.files_checked = len(files)
    for rule in registry.rules:
        try:
            out.problems += list(rule(out))
        except Exception as e:  # a plugin bug is not a problem in the user's file
            raise ForgeError(f"validation rule {getattr(rule, '__qualname__', rule)!r} failed: "
                             f"{type(e).__name__}: {e}") from e
    if strict:
        out.problems = [Problem(p.file, p.path, p.message, "error") for p in out.problems]
    order = {pf.display: i for i, pf in enumerate(files)}
    unique = dict.fromkeys(out.problems)        # a folder walked twice must not repeat its notes
    out.problems = [Problem(_one_line(p.file), _one_line(p.path), _one_line(p.message), p.severity)
                    for p in sorted(unique, key=lambda p: order.get(p.file, len(order)))]
    return out


def _one_line(text: str) -> str:
    """Escape what would break a `file::$.path: message` line: a path or value may hold a newline or
    another control character (U+001E and U+2028 end a line too)."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


def load_node(
    path: PathLike, *, strict: bool = False, registry: Optional[Registry] = None
) -> LoadedDescription:
    """A node description plus its contracts and plans; raises ConfigError on any error."""
    loaded = load_paths([path], strict=strict, registry=registry)
    target = Path(path).absolute()
    node = next((n for n in loaded.nodes.values() if n.source == target), None)
    if node is None and loaded.ok:
        raise ConfigError(
            [Problem(shown(path), "$", "expected a node description (top key 'node')")]
        )
    if not loaded.ok:
        raise ConfigError(loaded.errors + loaded.warnings)
    return LoadedDescription(
        node=node,
        contracts=loaded.node_contracts[node.node],
        plans=loaded.plans[node.node],
        warnings=loaded.warnings,
    )
