"""Walk one PPO iteration as a newcomer reads it, from the training command's `main`, statically.

    python tools/walk_iteration.py            # the walk, hop by hop, then its counts
    python tools/walk_iteration.py --json     # the counts only, as one JSON object

Nothing runs: the tool reads the package's syntax trees (about a second). The reader starts at
ENTRY and reads each function's calls depth first, in the order Python makes them (a call's
receiver and arguments before the call), both branches of an `if`, not the error paths (`except`
blocks, `raise`, `assert`):
- on the way to the iteration (ITERATION) it opens only the calls that lead there (`run`,
  `train_loop`...): the setup beside them (flags, models, run files) is passed;
- from there it opens every call into the package the first time it meets it. A function read
  already, called from another module, is a re-entry: a hop there and one back, once per calling
  function (the reader remembers what it read from there);
- the walk ends when ITERATION is read whole: the rollout, the update through its last optimiser
  step, the step's metrics. The run loop's evaluation and checkpoint after the step are not in it;
- the maths (MATHS) and the model (`is_model`) are read by name, not opened: `compute_gae`,
  `policy_logprobs` say what they return.

A call is resolved from the source: imported names (`from rlhf_helpers.x import f`), `module.f`,
`self.method` (base classes included), names and attributes whose class an annotation, an
assignment, a `with ... as` or a function's return annotation gives, a parameter as the call the
reader came by passed it (a function passed in is read as that function), and RECEIVERS for what
the code leaves untyped (`trainer: Any`; the way to the iteration is found by these and the
annotations only). A class called runs its `__init__`. A callable field
(`pieces.advantages(...)`) runs what the package stores in it (`self.f = ...`, `Pieces(f=...)`,
through `functools.partial` and local names): the maths when one of those is the maths (the
library's default piece). The calls it cannot resolve that may be the package's (a function held in
a variable, a package method's name on a receiver of unknown class) are listed.

A hop is a move to another module: into a function, or back to the caller's module when it ends.
Counts: `modules` read (a function opened there), `returns` (hops into a module the reader had
left), `hops`, `named` (modules only read by name); `modules_with_maths` and `returns_with_maths`
are those of the same walk with the maths opened too, a module at a time (what the maths calls in
another maths module, such as its input checks, stays read by name; the model too).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from rlhf_helpers.runtime.interrupt import one_line_interrupt

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlhf_helpers"
ENTRY = "stages/train_ppo.py:main"  #: where the reader starts: the training command
ITERATION = "PPOTrainer.step"  #: one iteration: the walk ends once it is read whole
MATHS = "core/"  #: the maths: read by name
#: the model, read by name: any module under MODEL_FOLDER, and these (until they move there)
MODEL_FOLDER = "ppo/model/"
MODEL_MODULES = {"ppo/shared_model.py", "ppo/shared_adapters.py", "ppo/adapters.py",
                 "ppo/value_head.py", "ppo/fused_lora.py", "ppo/packed_gpt2.py",
                 "ppo/gpt2_decoder.py", "ppo/fast_decoder.py"}
#: names the code leaves untyped (`trainer: Any`), as a parameter, a variable or an attribute:
#: the name of the package's class they hold
RECEIVERS = {"trainer": "PPOTrainer", "model": "SharedLoRAModel",
             "policy_opt": "AdapterOptimizer", "value_opt": "AdapterOptimizer"}
DEPTH = 12  #: how far a name's type or value is followed (aliases of aliases...)


def is_model(module: str) -> bool:
    return module.startswith(MODEL_FOLDER) or module in MODEL_MODULES


@dataclass(frozen=True)
class Def:
    """A function or a class of the package: its module ("ppo/trainer.py") and qualified name."""

    module: str
    qualname: str
    node: ast.AST = field(compare=False, repr=False)
    owner: Def | None = field(default=None, compare=False, repr=False)  #: a method's class

    @property
    def is_class(self) -> bool:
        return isinstance(self.node, ast.ClassDef)


@dataclass(frozen=True)
class ModuleRef:
    module: str


@dataclass
class Scope:
    """What the names of one function (or of a module's top level) refer to."""

    module: str
    function: Def | None = None
    owner: Def | None = None  #: the class of `self`
    self_name: str | None = None
    params: set[str] = field(default_factory=set)
    annotations: dict[str, ast.expr] = field(default_factory=dict)  #: parameters, annotated locals
    values: dict[str, list[ast.expr]] = field(default_factory=lambda: defaultdict(list))
    nested: dict[str, Def] = field(default_factory=dict)  #: functions defined inside
    #: what the call the reader came by passed for each parameter: (argument, caller's scope)
    bound: dict[str, tuple[ast.expr, Scope]] = field(default_factory=dict)

    def holds(self, name: str) -> bool:
        """Whether `name` is a parameter or a local variable here."""
        return name in self.params or name in self.annotations or name in self.values


def last_name(expr: ast.expr) -> str | None:
    """`f` of `f`, `a.b.f`; None for anything else."""
    return expr.id if isinstance(expr, ast.Name) else getattr(expr, "attr", None)


@cache
def calls_in(node: ast.AST) -> tuple[ast.Call, ...]:
    """The calls of a function's body in the order they run: a call's receiver and arguments
    first; nested definitions, `except` blocks, `raise` and `assert` left out."""
    found: list[ast.Call] = []

    def visit(n: ast.AST) -> None:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
                          ast.Raise, ast.Assert, ast.ExceptHandler)):
            return
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            if n.value is not None:
                visit(n.value)
            return
        for child in ast.iter_child_nodes(n):  # a Call's fields: func, args, keywords
            visit(child)
        if isinstance(n, ast.Call):
            found.append(n)

    for statement in getattr(node, "body", []):
        visit(statement)
    return tuple(found)


class Package:
    """The package's source, parsed on demand, and what its names refer to."""

    def __init__(self, root: Path) -> None:
        self.root, self.name = root, root.name
        self.trees: dict[str, ast.Module] = {}

    @cache  # noqa: B019 - one Package per walk
    def text(self, module: str) -> str:
        return (self.root / module).read_text()

    def tree(self, module: str) -> ast.Module:
        if module not in self.trees:
            self.trees[module] = ast.parse(self.text(module), module)
        return self.trees[module]

    def mentioning(self, words: str) -> list[str]:
        """The modules whose source holds `words`: the only ones parsed for a search."""
        return [m for m in self.modules() if words in self.text(m)]

    @cache  # noqa: B019 - one Package per walk
    def modules(self) -> tuple[str, ...]:
        return tuple(sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*.py")))

    def module_of(self, dotted: str) -> str | None:
        """"rlhf_helpers.ppo.trainer" -> "ppo/trainer.py" (None: not the package's)."""
        parts = dotted.split(".")
        if parts[0] != self.name:
            return None
        for path in ("/".join(parts[1:]) + ".py", "/".join([*parts[1:], "__init__.py"])):
            if (self.root / path).is_file():
                return path.lstrip("/")
        return None

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = [self.name, *module.split("/")[:-1]][: len(module.split("/")) + 1 - node.level]
        return ".".join(base + ([node.module] if node.module else []))

    def lookup(self, module: str, name: str, depth: int = 0) -> Def | ModuleRef | None:
        """What `name` is at the top level of `module`, followed through imports and aliases."""
        if depth > DEPTH:
            return None
        found: Def | ModuleRef | None = None  # the last binding wins, as in Python
        for node in self.tree(module).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name == name:
                    found = Def(module, name, node)
            elif isinstance(node, ast.Import):
                for alias in node.names:  # `import rlhf_helpers.x as x` (bare: not followed)
                    if alias.asname == name and (target := self.module_of(alias.name)):
                        found = ModuleRef(target)
            elif isinstance(node, ast.ImportFrom):
                source = self.absolute(module, node)
                for alias in node.names:
                    if alias.name == "*" and (star := self.module_of(source)):
                        found = found or self.lookup(star, name, depth + 1)
                    elif (alias.asname or alias.name) == name:
                        submodule = self.module_of(f"{source}.{alias.name}")
                        origin = self.module_of(source)
                        found = (ModuleRef(submodule) if submodule else None if origin is None
                                 else self.lookup(origin, alias.name, depth + 1))
            elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
                  and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)):
                found = self.lookup(module, node.value.id, depth + 1)
        return found

    def method(self, cls: Def, name: str, depth: int = 0) -> Def | None:
        """`cls.name` as a function defined in the class or one of the package's bases."""
        for node in cls.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return Def(cls.module, f"{cls.qualname}.{name}", node, cls)
        for base in self.bases(cls) if depth < DEPTH else []:
            if found := self.method(base, name, depth + 1):
                return found
        return None

    def bases(self, cls: Def) -> list[Def]:
        return [b for expr in cls.node.bases if isinstance(b := self.refer(cls.module, expr), Def)
                and b.is_class]

    def refer(self, module: str, expr: ast.expr) -> Def | ModuleRef | None:
        """What a top-level name (`f`, `module.f`, `Class.method`) of `module` refers to."""
        if isinstance(expr, ast.Name):
            return self.lookup(module, expr.id)
        if isinstance(expr, ast.Attribute):
            return self.member(self.refer(module, expr.value), expr.attr)
        return None

    def member(self, owner: Def | ModuleRef | None, name: str) -> Def | ModuleRef | None:
        """`module.name` or `Class.name`."""
        if isinstance(owner, ModuleRef):
            return self.lookup(owner.module, name)
        return self.method(owner, name) if isinstance(owner, Def) and owner.is_class else None

    @cache  # noqa: B019 - one Package per walk
    def functions(self, module: str) -> tuple[Def, ...]:
        """Every function of `module`, methods and nested functions included."""
        found: list[Def] = []

        def visit(node: ast.AST, prefix: str, owner: Def | None) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append(Def(module, prefix + child.name, child, owner))
                    visit(child, f"{prefix}{child.name}.<locals>.", None)
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.", Def(module, prefix + child.name, child))
                elif isinstance(child, ast.stmt):
                    visit(child, prefix, owner)

        visit(self.tree(module), "", None)
        return tuple(found)

    @cache  # noqa: B019 - one Package per walk
    def classes_named(self, name: str) -> tuple[Def, ...]:
        return tuple(Def(m, name, node) for m in self.mentioning(f"class {name}")
                     for node in self.tree(m).body
                     if isinstance(node, ast.ClassDef) and node.name == name)

    def function(self, spec: str) -> Def:
        """"module.py:name" or "Class.method" (its class found anywhere in the package)."""
        if ":" in spec:
            module, name = spec.split(":")
            found = self.lookup(module, name) if (self.root / module).is_file() else None
        else:
            cls_name, name = spec.split(".")
            methods = [self.method(cls, name) for cls in self.classes_named(cls_name)]
            found = methods[0] if len(methods) == 1 else None
        if not isinstance(found, Def) or found.is_class:
            raise LookupError(f"{spec}: not one function of {self.root}")
        return found


class Resolver:
    """What a call runs (the package's functions it reaches), and what a name holds (the package's
    classes of its value), from the source alone."""

    def __init__(self, package: Package, receivers: dict[str, str]) -> None:
        self.package, self.receivers = package, receivers
        self.scopes: dict[int, Scope] = {}
        self.stored_cache: dict[tuple[Def, str], list[Def]] = {}
        self.calls_by_name: dict[str, list[tuple[ast.Call, Scope]]] = {}
        self.assigned: dict[Def, dict[str, list[tuple[ast.AST, Scope]]]] = {}

    def scope(self, fn: Def) -> Scope:
        """The parameters' annotations, the locals' values and the nested functions of `fn`."""
        if id(fn.node) in self.scopes:
            return self.scopes[id(fn.node)]
        scope = Scope(fn.module, fn, fn.owner)
        args = fn.node.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        static = any(last_name(d) in ("staticmethod", "classmethod")
                     for d in fn.node.decorator_list)
        if fn.owner is not None and params and not static:
            scope.self_name = params[0].arg
        scope.params = {a.arg for a in params} | {a.arg for a in (args.vararg, args.kwarg) if a}
        scope.annotations = {a.arg: a.annotation for a in params if a.annotation is not None}
        todo = list(fn.node.body)
        while todo:  # the function's own statements, not those of the functions nested in it
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope.nested[node.name] = Def(fn.module, f"{fn.qualname}.<locals>.{node.name}",
                                              node)
                continue
            if isinstance(node, (ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs = ([(target, node.value)] if isinstance(target, ast.Name) else
                             zip(target.elts, node.value.elts, strict=False)
                             if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                             else [])
                    for name, value in pairs:
                        if isinstance(name, ast.Name):
                            scope.values[name.id].append(value)
            elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
                scope.values[node.optional_vars.id].append(node.context_expr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                scope.annotations[node.target.id] = node.annotation
                if node.value is not None:
                    scope.values[node.target.id].append(node.value)
            todo.extend(ast.iter_child_nodes(node))
        self.scopes[id(fn.node)] = scope
        return scope

    def symbols(self, expr: ast.expr, scope: Scope) -> list[Def | ModuleRef]:
        """The functions, classes or modules a name or attribute chain refers to (not values)."""
        found: Def | ModuleRef | None = None
        if isinstance(expr, ast.Name) and expr.id in scope.nested:
            found = scope.nested[expr.id]
        elif isinstance(expr, ast.Name) and not scope.holds(expr.id):  # not a local variable
            found = self.package.lookup(scope.module, expr.id)
        elif isinstance(expr, ast.Attribute):
            return [m for owner in self.symbols(expr.value, scope)
                    if (m := self.package.member(owner, expr.attr)) is not None]
        return [found] if found is not None else []

    def targets(self, call: ast.Call, scope: Scope) -> list[Def]:
        """The package's functions a call runs: a class's `__init__` and `__post_init__`."""
        found: list[Def] = []
        for fn in self.callables(call.func, scope, 0):
            methods = ([self.package.method(fn, n) for n in ("__init__", "__post_init__")]
                       if fn.is_class else [fn])
            for target in filter(None, methods):
                if target not in found:
                    found.append(target)
        return found

    @staticmethod
    def bind(call: ast.Call, caller: Scope, target: Def) -> dict[str, tuple[ast.expr, Scope]]:
        """The target's parameters as `call` passes them (a method's `self` left out)."""
        args = target.node.args
        positional = [a.arg for a in [*args.posonlyargs, *args.args]]
        static = any(last_name(d) in ("staticmethod", "classmethod")
                     for d in target.node.decorator_list)
        if target.owner is not None and not static:
            positional = positional[1:]
        bound = {name: (value, caller) for name, value in zip(positional, call.args, strict=False)
                 if not isinstance(value, ast.Starred)}
        names = set(positional) | {a.arg for a in args.kwonlyargs}
        return {**bound, **{kw.arg: (kw.value, caller) for kw in call.keywords if kw.arg in names}}

    def callables(self, expr: ast.expr, scope: Scope, depth: int) -> list[Def]:
        """The functions (or classes) that calling `expr` may run."""
        if depth > DEPTH:
            return []
        if isinstance(expr, ast.Call):  # partial(f, ...) is f
            if last_name(expr.func) == "partial" and expr.args:
                return self.callables(expr.args[0], scope, depth + 1)
            return []
        if isinstance(expr, (ast.IfExp, ast.BoolOp)):
            branches = expr.values if isinstance(expr, ast.BoolOp) else [expr.body, expr.orelse]
            return [fn for b in branches for fn in self.callables(b, scope, depth + 1)]
        if isinstance(expr, ast.Name) and expr.id in scope.values:
            return [fn for v in scope.values[expr.id] for fn in self.callables(v, scope, depth + 1)]
        if isinstance(expr, ast.Name) and expr.id in scope.bound:  # a function passed in
            argument, caller = scope.bound[expr.id]
            return self.callables(argument, caller, depth + 1)
        found = [s for s in self.symbols(expr, scope) if isinstance(s, Def)]
        if found or not isinstance(expr, ast.Attribute):
            return found
        for cls in self.types(expr.value, scope, depth + 1):
            method = self.package.method(cls, expr.attr)
            found += [method] if method else self.stored(cls, expr.attr, depth + 1)
        return found

    def types(self, expr: ast.expr, scope: Scope, depth: int) -> list[Def]:
        """The package's classes whose instances `expr` may hold."""
        if depth > DEPTH:
            return []
        found: list[Def] = []
        if isinstance(expr, ast.Name):
            if expr.id == scope.self_name and scope.owner is not None:
                return [scope.owner]
            annotation = scope.annotations.get(expr.id)
            if annotation is not None:
                found = self.annotated(annotation, scope.module)
            for value in [] if found else scope.values.get(expr.id, []):
                found += self.types(value, scope, depth + 1)
            if not found and expr.id in scope.bound:  # what the call the reader came by passed
                argument, caller = scope.bound[expr.id]
                found = self.types(argument, caller, depth + 1)
            untyped = annotation is None or ast.unparse(annotation) in ("Any", "'Any'")
            return found or (self.declared(expr.id) if untyped else [])
        if isinstance(expr, ast.Attribute):
            for cls in self.types(expr.value, scope, depth + 1):
                found += self.attribute_types(cls, expr.attr, depth + 1)
            return found or self.declared(expr.attr)
        if isinstance(expr, ast.Call):
            for fn in self.callables(expr.func, scope, depth + 1):
                found += ([fn] if fn.is_class else self.annotated(fn.node.returns, fn.module)
                          if fn.node.returns is not None else [])
        return found

    def declared(self, name: str) -> list[Def]:
        """RECEIVERS' class for `name`."""
        return list(self.package.classes_named(self.receivers.get(name, "")))

    def annotated(self, annotation: ast.expr, module: str) -> list[Def]:
        """The package's classes an annotation names (`X`, `X | None`, `Optional[X]`, "X")."""
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            return self.annotated(ast.parse(annotation.value, mode="eval").body, module)
        if isinstance(annotation, ast.BinOp):
            return [c for side in (annotation.left, annotation.right)
                    for c in self.annotated(side, module)]
        if isinstance(annotation, ast.Subscript):
            if ast.unparse(annotation.value).split(".")[-1] not in ("Optional", "Union"):
                return []
            inner = annotation.slice
            return [c for e in (inner.elts if isinstance(inner, ast.Tuple) else [inner])
                    for c in self.annotated(e, module)]
        found = self.package.refer(module, annotation)
        return [found] if isinstance(found, Def) and found.is_class else []

    def methods(self, cls: Def) -> list[Def]:
        return [Def(c.module, f"{c.qualname}.{n.name}", n, c)
                for c in [cls, *self.package.bases(cls)] for n in c.node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def self_assignments(self, cls: Def, attr: str) -> list[tuple[ast.AST, Scope]]:
        """`self.attr = value` (or `self.attr: T = value`) in the class's methods: (node, scope)."""
        if cls not in self.assigned:
            self.assigned[cls] = defaultdict(list)
            for method in self.methods(cls):
                scope = self.scope(method)
                for node in ast.walk(method.node):
                    targets = (node.targets if isinstance(node, ast.Assign) else
                               [node.target] if isinstance(node, ast.AnnAssign) else [])
                    for t in targets:
                        if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                                and t.value.id == scope.self_name):
                            self.assigned[cls][t.attr].append((node, scope))
        return self.assigned[cls].get(attr, [])

    def attribute_types(self, cls: Def, attr: str, depth: int) -> list[Def]:
        """The classes of `instance.attr`: the class's annotation, a property's return, or what
        its methods assign to `self.attr`."""
        found: list[Def] = []
        for c in [cls, *self.package.bases(cls)]:
            for node in c.node.body:
                if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                        and node.target.id == attr):
                    found += self.annotated(node.annotation, c.module)
                elif (isinstance(node, ast.FunctionDef) and node.name == attr
                      and node.returns is not None):
                    found += self.annotated(node.returns, c.module)
        for node, scope in self.self_assignments(cls, attr):
            annotated = isinstance(node, ast.AnnAssign)
            found += (self.annotated(node.annotation, scope.module) if annotated
                      else self.types(node.value, scope, depth + 1))
        return list(dict.fromkeys(found))

    def stored(self, cls: Def, attr: str, depth: int) -> list[Def]:
        """The functions a callable field holds (`pieces.advantages`): what the class's methods
        assign to it and what the package's constructor calls pass for it; the maths alone when
        one of them is the maths (the library's default piece)."""
        if (cls, attr) in self.stored_cache:
            return self.stored_cache[cls, attr]
        self.stored_cache[cls, attr] = []  # a field that holds itself: nothing more
        found = [fn for node, scope in self.self_assignments(cls, attr) if node.value is not None
                 for fn in self.callables(node.value, scope, depth + 1)]
        for call, scope in self.constructions(cls):
            found += [fn for kw in call.keywords if kw.arg == attr
                      for fn in self.callables(kw.value, scope, depth + 1)]
        maths = [fn for fn in found if fn.module.startswith(MATHS)]
        self.stored_cache[cls, attr] = list(dict.fromkeys(maths or found))
        return self.stored_cache[cls, attr]

    def calls_named(self, name: str) -> list[tuple[ast.Call, Scope]]:
        """Every call of the package's functions that names `name` (`name(...)`, `x.name(...)`),
        with the caller's scope."""
        if name not in self.calls_by_name:
            self.calls_by_name[name] = [
                (call, self.scope(fn)) for module in self.package.mentioning(f"{name}(")
                for fn in self.package.functions(module) for call in calls_in(fn.node)
                if last_name(call.func) == name]
        return self.calls_by_name[name]

    def constructions(self, cls: Def) -> list[tuple[ast.Call, Scope]]:
        """Every call of the class in the package's functions, with the caller's scope."""
        return [(call, scope) for call, scope in self.calls_named(cls.node.name)
                if cls in self.callables(call.func, scope, DEPTH - 1)]


@dataclass
class Walk:
    """The reader's path: the module after each hop, and what was opened or read by name."""

    path: list[str] = field(default_factory=list)  #: the first: the command's module
    lines: list[str] = field(default_factory=list)  #: one line per function opened or hop
    opened: list[Def] = field(default_factory=list)
    named: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    unresolved: list[str] = field(default_factory=list)  #: calls on a receiver of unknown type

    @property
    def returns(self) -> int:
        """Hops into a module the reader had already left."""
        return sum(module in self.path[:i] for i, module in enumerate(self.path))

    def counts(self) -> dict[str, int]:
        modules = {fn.module for fn in self.opened}
        return {"modules": len(modules), "returns": self.returns, "hops": len(self.path) - 1,
                "named": len(set(self.named) - modules)}


class Reader:
    """Reads from the entry to the end of the iteration, depth first, as the module docstring
    says."""

    def __init__(self, resolver: Resolver, iteration: Def, leads: set[Def],
                 open_maths: bool) -> None:
        self.resolver, self.iteration, self.leads = resolver, iteration, leads
        self.open_maths = open_maths
        self.walk = Walk()
        self.read_already: set[Def] = set()
        #: (caller, function): the function read already, seen from that caller
        self.seen_from: set[tuple[Def, Def]] = set()
        #: the names of the package's methods: a call of one on a receiver of unknown type is
        #: listed as not followed
        self.method_names = {name for m in resolver.package.modules()
                             for name in re.findall(r"\n +def (\w+)\(self\b",
                                                    resolver.package.text(m))}
        self.inside = self.done = False

    def by_name(self, target: Def, caller: Def) -> bool:
        """The model, and the maths: opened in the walk with the maths when the engine calls it,
        a module at a time (what the maths calls in another module, its checks, by name)."""
        if not target.module.startswith(MATHS):
            return is_model(target.module)
        return not self.open_maths or (caller.module.startswith(MATHS)
                                       and caller.module != target.module)

    def move(self, fn: Def, why: str) -> None:
        if self.walk.path and self.walk.path[-1] == fn.module:
            if why == "opens":
                self.walk.lines.append(f"   {fn.qualname}")
            return
        arrow = "<-" if fn.module in self.walk.path else "->"
        note = "" if why == "opens" else f" ({why})"
        self.walk.lines.append(f"{arrow} {fn.module}: {fn.qualname}{note}")
        self.walk.path.append(fn.module)

    def read(self, fn: Def, bound: dict[str, tuple[ast.expr, Scope]] | None = None) -> None:
        """Read `fn`'s calls; `bound`: its parameters as the call the reader came by passed them."""
        scope = self.resolver.scope(fn)
        scope = replace(scope, bound=bound) if bound else scope
        for call in calls_in(fn.node):
            targets = self.resolver.targets(call, scope)
            if not targets and self.inside and self.blind_spot(call.func, scope):
                self.walk.unresolved.append(f"{fn.module}: {fn.qualname}: {ast.unparse(call.func)}")
            for target in targets:
                self.meet(target, fn, self.resolver.bind(call, scope, target))
                if self.done:
                    return

    def blind_spot(self, func: ast.expr, scope: Scope) -> bool:
        """An unresolved call that may be the package's: a function held in a variable or a
        parameter, or a package method's name on a receiver of unknown class (not a module's
        function: `torch.where`)."""
        if isinstance(func, ast.Name):
            return scope.holds(func.id)
        if not (isinstance(func, ast.Attribute) and func.attr in self.method_names):
            return False
        while isinstance(func, ast.Attribute):
            func = func.value
        return isinstance(func, ast.Name) and scope.holds(func.id)

    def meet(self, target: Def, caller: Def, bound: dict[str, tuple[ast.expr, Scope]]) -> None:
        if not self.inside and target not in self.leads:
            return  # the setup beside the way to the iteration
        if self.by_name(target, caller):
            self.walk.named[target.module].add(target.qualname)
            return
        if target in self.read_already:
            # a re-entry: there and back, once per calling function (the reader remembers it)
            if target.module != caller.module and (caller, target) not in self.seen_from:
                self.move(target, "again")
                self.move(caller, "back")
            self.seen_from.add((caller, target))
            return
        self.read_already.add(target)
        self.seen_from.add((caller, target))
        self.walk.opened.append(target)
        self.inside = self.inside or target == self.iteration
        self.move(target, "opens")
        self.read(target, bound)
        if target == self.iteration:
            self.done = True
        if not self.done:
            self.move(caller, "back")


def leads_to(resolver: Resolver, iteration: Def) -> set[Def]:
    """The functions from which a reader reaches the iteration: its callers, theirs... (a call
    that names the function: `train_loop(...)`, `trainer.step()`)."""
    leads, todo = {iteration}, [iteration]
    while todo:
        fn = todo.pop()
        name = fn.owner.node.name if fn.owner and fn.node.name == "__init__" else fn.node.name
        for call, scope in resolver.calls_named(name):
            caller = scope.function
            if caller not in leads and fn in resolver.targets(call, scope):
                leads.add(caller)
                todo.append(caller)
    return leads


def walk_one_iteration(root: Path = PACKAGE, entry: str = ENTRY, iteration: str = ITERATION,
                       receivers: dict[str, str] | None = None) -> tuple[Walk, Walk]:
    """The reader's walk through the package at `root`, from `entry` to the end of `iteration`:
    with the maths read by name, and with the maths opened."""
    package = Package(root)
    resolver = Resolver(package, RECEIVERS if receivers is None else receivers)
    start, end = package.function(entry), package.function(iteration)
    leads = leads_to(resolver, end)
    if start not in leads:
        raise LookupError(f"{entry} never reaches {iteration} (or the tool cannot see how)")
    walks = []
    for open_maths in (False, True):
        reader = Reader(resolver, end, leads, open_maths)
        reader.walk.opened.append(start)
        reader.read_already.add(start)
        reader.move(start, "opens")
        reader.read(start)
        walks.append(reader.walk)
    return walks[0], walks[1]


def all_counts(walk: Walk, with_maths: Walk) -> dict[str, int]:
    """The walk's counts, with those of the walk that opens the maths too."""
    more = with_maths.counts()
    return {**walk.counts(), "modules_with_maths": more["modules"],
            "returns_with_maths": more["returns"]}


@one_line_interrupt("tools/walk_iteration.py", "nothing was written")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the counts only, as JSON")
    args = parser.parse_args(argv)
    try:
        walk, with_maths = walk_one_iteration()
    except LookupError as error:
        parser.exit(2, f"tools/walk_iteration.py: error: {error}\n")
    if not args.json:
        print("\n".join(walk.lines))
        for module, names in sorted(walk.named.items()):
            print(f"read by name: {module}: {', '.join(sorted(names))}")
        if walk.unresolved:
            print("not followed (a function held in a variable, or a receiver of unknown class):")
            print("\n".join(f"   {call}" for call in dict.fromkeys(walk.unresolved)))
    print(json.dumps(all_counts(walk, with_maths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
