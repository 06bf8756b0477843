"""Values as plain JSON, both ways: the form in which the MBPP executor (code_exec.py) sends a test's arguments to
the child that runs the code under test, and reads back what its functions returned.

JSON's null, booleans, numbers (NaN and infinities included), strings and lists stand for themselves; tuples, sets,
frozensets, dicts (any hashable keys), bytes and complex numbers are tagged ({"tuple": [...]}, {"dict": [[k, v],
...]}). Subclasses are written as their base type, so what is read back is always a plain value: an object of the
code under test with an `__eq__` of its own cannot cross. Anything else is refused (TypeError when writing,
ValueError when reading). Standard library only and self-contained: code_exec.py runs this file's source inside the
child too, so both sides use one definition.
"""
TAGGED = (("tuple", tuple), ("frozenset", frozenset), ("set", set))


def to_plain(value):
    if value is None or value is True or value is False:
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    for tag, kind in TAGGED:
        if isinstance(value, kind):
            return {tag: [to_plain(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[to_plain(k), to_plain(v)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    raise TypeError(f"no plain form for {type(value).__name__}")


def from_plain(value, depth: int = 0):
    if depth > 100:
        raise ValueError("nested more than 100 deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [from_plain(v, depth + 1) for v in value]
    if not (isinstance(value, dict) and len(value) == 1):
        raise ValueError(f"not a plain value: {str(value)[:60]}")
    (tag, inner), = value.items()
    kinds = dict(TAGGED)
    if tag in kinds and isinstance(inner, list):
        return kinds[tag](from_plain(v, depth + 1) for v in inner)
    if tag == "dict" and isinstance(inner, list) and all(isinstance(p, list) and len(p) == 2 for p in inner):
        return {from_plain(k, depth + 1): from_plain(v, depth + 1) for k, v in inner}
    if tag == "bytes" and isinstance(inner, str):
        return bytes.fromhex(inner)
    if tag == "complex" and isinstance(inner, list) and len(inner) == 2:
        return complex(*(float(x) for x in inner))
    raise ValueError(f"not a plain value: {tag}")
