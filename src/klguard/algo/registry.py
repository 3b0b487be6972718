"""One registry style for algo/: named functions added by a decorator, each with the inputs it declares.

verl registers its policy losses (`register_policy_loss`) and advantage estimators (`register_adv_est`) this way;
klguard registers those two kinds and the KL controllers with this one class. A registry's `entries` is its
name -> function dict, in registration order (the order of the config's choices); `inputs(name)` is what a
registration declared it needs, the question a caller (the trainer, the controller builder) asks instead of keeping
its own list of names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Named functions of one kind. `kind` names an entry in errors ("unknown policy loss 'x'"); `known`, when given,
    maps every input a registration may declare to what it is, and a registration declaring another one fails."""

    def __init__(self, kind: str, known: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self.known = known
        self.entries: dict[str, F] = {}
        self._inputs: dict[str, tuple[str, ...]] = {}

    def register(self, name: str, inputs: Sequence[str] = ()) -> Callable[[F], F]:
        """Decorator: make `fn` the entry called `name` (a name is registered once), needing `inputs`."""
        inputs = tuple(inputs)
        if self.known is not None and (unknown := [i for i in inputs if i not in self.known]):
            raise ValueError(f"{self.kind} {name!r} declares unknown inputs {unknown}; known: {', '.join(self.known)}")

        def add(fn: F) -> F:
            if name in self.entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self.entries[name], self._inputs[name] = fn, inputs
            return fn

        return add

    def unregister(self, name: str) -> None:
        """Remove an entry (a test's throwaway one)."""
        del self.entries[name]
        self._inputs.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def get(self, name: str) -> F:
        fn = self.entries.get(name)
        if fn is None:
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.entries)}")
        return fn

    def inputs(self, name: str, undeclared: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The inputs the entry `name` declared; `undeclared` for one put into `entries` without the decorator."""
        self.get(name)
        return self._inputs.get(name, undeclared)

    def declaring(self, input: str) -> Set[str]:
        """The names of the entries that declare `input`, as the registry holds them when asked (a live view)."""
        return _Declaring(self, input)


class _Declaring(Set[str]):
    def __init__(self, registry: Registry, input: str) -> None:
        self._registry, self._input = registry, input

    def _names(self) -> list[str]:
        return [n for n in self._registry.entries if self._input in self._registry.inputs(n)]

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return f"{{{', '.join(map(repr, self._names()))}}}"
