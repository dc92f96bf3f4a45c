"""What compiling a module with mypyc (scripts/compile.py) asks of it, in one place.

Number: an int or a float, kept as it came. In a compiled module an annotation says what the C
code does with a value: `float` there turns an int into a float (5 becomes 5.0). Times and budgets
may be either (simpy's clock starts at the int 0; a token budget is an int, or inf where none
applies), and an int that became a float would print differently. So where a value may be
either, it is annotated Number, which mypyc keeps as the object it was given, as Python does.

Pickling: a compiled class is made only through its __init__ (pickle's default makes the object
without it and fills in its __dict__, which a compiled class does not have). A class that is
pickled (a replica's step log, sent back from a worker process) reduces to its constructor, the
arguments of an empty one and attributes_of(itself), and sets them back with set_attributes.
"""

from __future__ import annotations

from typing import Any, Callable, Union

Number = Union[int, float]


def attributes_of(obj: Any) -> dict[str, Any]:
    """The object's attributes: a compiled class's (its __mypyc_attrs__), and its __dict__'s
    (a plain class's, or those an uncompiled subclass of a compiled one adds)."""
    names = getattr(type(obj), "__mypyc_attrs__", ())
    attributes = {name: getattr(obj, name) for name in names if not name.startswith("__") and hasattr(obj, name)}
    attributes.update(getattr(obj, "__dict__", {}))
    return attributes


def shallow_copy(obj: Any, empty: Callable[[], Any] | None = None) -> Any:
    """copy.copy's shallow copy: obj's attributes set on empty() (a compiled class is made only
    through its __init__), or on an object its class's __new__ makes without one (a compiled class
    that allows uncompiled subclasses, whose copy.copy shares the subclass's __dict__ with the copy)."""
    clone = type(obj).__new__(type(obj)) if empty is None else empty()
    set_attributes(clone, attributes_of(obj))
    return clone


def set_attributes(obj: Any, attributes: dict[str, Any]) -> None:
    """Set them on obj (a pickled class's __setstate__: pickle makes an empty one first, so that
    the attributes may refer back to it)."""
    for name, value in attributes.items():
        setattr(obj, name, value)
