"""Record classes: the part of the standard library's dataclasses the broker uses, without
importing dataclasses (which imports inspect, ast and dis: about 1 MiB of an idle broker's
memory, docs/deploy.md).

    @record                       # or @record(frozen=True), @record(slots=True)
    class Point:
        x: int
        y: int = 0
        seen: list = field(default_factory=list)

The fields are the class's own annotations, in order. A field's default is its class
attribute, or ``field(default=..., default_factory=..., compare=..., repr=..., metadata=...)``.
The class gets ``__init__`` (taking the fields by position or name, then calling
``__post_init__`` when the class has one), ``__repr__`` and ``__eq__`` over the fields (less
those with ``repr`` or ``compare`` False). A frozen class refuses assignments
(``FrozenError``, an ``AttributeError``) and hashes its compared fields; the others are not
hashable. ``slots``: the class has ``__slots__`` of its fields and no ``__dict__``.
``fields(cls)`` and ``replace(obj, **changes)`` are those of dataclasses. No inheritance
between record classes (the broker has none).
"""

from __future__ import annotations

from operator import attrgetter

MISSING = object()   # no default


class FrozenError(AttributeError):
    """An assignment to a field of a frozen record."""


class Field:
    __slots__ = ("name", "type", "default", "default_factory", "compare", "repr", "metadata")

    def __init__(self, default=MISSING, default_factory=MISSING, compare=True, repr=True,
                 metadata=None):
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("a field has a default or a default_factory, not both")
        self.name = self.type = None   # set by record
        self.default = default
        self.default_factory = default_factory
        self.compare = compare
        self.repr = repr
        self.metadata = metadata or {}

    def __repr__(self) -> str:
        return f"Field({self.name!r})"


def field(*, default=MISSING, default_factory=MISSING, compare: bool = True, repr: bool = True,
          metadata: dict | None = None) -> Field:
    return Field(default, default_factory, compare, repr, metadata)


def fields(class_or_record) -> tuple[Field, ...]:
    return class_or_record.__record_fields__


def replace(obj, **changes):
    """A new record of ``obj``'s class: its fields, with ``changes`` (through ``__init__``)."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    unknown = changes.keys() - values.keys()
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    values.update(changes)
    return type(obj)(**values)


def record(cls=None, /, *, frozen: bool = False, slots: bool = False):
    """The class decorator (see the module's docstring)."""
    def make(cls):
        return _make(cls, frozen, slots)
    return make if cls is None else make(cls)


def _make(cls, frozen: bool, slots: bool):
    found = []
    for name, kind in cls.__dict__.get("__annotations__", {}).items():
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name, f.type = name, kind
        found.append(f)
    found = tuple(found)
    namespace = dict(cls.__dict__)
    for f in found:   # class attributes: the plain defaults (none with slots)
        namespace.pop(f.name, None)
        if not slots and f.default is not MISSING:
            namespace[f.name] = f.default
    namespace["__record_fields__"] = found
    namespace["__init__"] = _init(cls.__qualname__, found, frozen, "__post_init__" in namespace)
    namespace["__repr__"] = _repr([f.name for f in found if f.repr])
    compared = [f.name for f in found if f.compare]
    key = attrgetter(*compared) if compared else (lambda obj: ())
    namespace["__eq__"] = _eq(key)
    namespace["__hash__"] = (lambda self: hash(key(self))) if frozen else None
    if frozen:
        namespace["__setattr__"] = namespace["__delattr__"] = _refuse
    # The class is made again (the descriptors of the first one's instance dict go).
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    if slots:
        namespace["__slots__"] = tuple(f.name for f in found)
    return type(cls)(cls.__name__, cls.__bases__, namespace)


def _init(qualname: str, found: tuple[Field, ...], frozen: bool, post_init: bool):
    """``__init__``, written out and compiled as dataclasses does: as fast as a hand-written one
    (records are made on the log's hot paths)."""
    scope = {"MISSING": MISSING, "setattr": object.__setattr__}
    params, body = [], []
    for f in found:
        name = f.name
        if f.default is not MISSING:
            scope[f"default_{name}"] = f.default
            params.append(f"{name}=default_{name}")
            value = name
        elif f.default_factory is not MISSING:
            scope[f"factory_{name}"] = f.default_factory
            params.append(f"{name}=MISSING")
            value = f"factory_{name}() if {name} is MISSING else {name}"
        else:
            if params and "=" in params[-1]:
                raise TypeError(f"{qualname}: field {name!r} without a default follows one with")
            params.append(name)
            value = name
        body.append(f"setattr(self, {name!r}, {value})" if frozen else f"self.{name} = {value}")
    if post_init:
        body.append("self.__post_init__()")
    source = f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(body or ["pass"])
    exec(source, scope)
    init = scope["__init__"]
    init.__qualname__ = f"{qualname}.__init__"
    return init


def _repr(names: list[str]):
    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__qualname__}({shown})"
    return __repr__


def _eq(key):
    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return key(self) == key(other)
    return __eq__


def _refuse(self, name, *value):
    raise FrozenError(f"{type(self).__name__} is frozen: cannot change {name!r}")
