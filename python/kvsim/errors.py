"""kvsim's named errors as Python exceptions.

Every validation error of the C++ contract (docs/errors.md) is raised as the
subclass of :class:`Error` named after it: ``slot_beyond_pool`` becomes
``SlotBeyondPool``, ``shape_mismatch`` ``ShapeMismatch``. The message is
core's: which sequence, entry, value and rule. A raised Error means no byte of
any cache tensor was written.
"""

NAMES = [
    "bad_geometry", "bad_strides", "unsupported_head_dim", "unsupported_page_size", "indptr_bad_start",
    "non_monotone_indptr", "indices_size_mismatch", "block_out_of_range", "last_page_len_out_of_range",
    "position_beyond_sequence", "write_through_bad_page", "slot_beyond_pool", "shared_block_write",
    "secondary_not_onboarded", "bad_global_scale", "bad_window", "shape_mismatch", "bad_argument", "bad_scenario",
    "unsupported_attention_order",
]


class Error(Exception):
    """Base of every kvsim error; ``name`` is the error's name in docs/errors.md."""

    name = "error"


def _class_name(name):
    return "".join(part.capitalize() for part in name.split("_"))


_CLASSES = {}
for _name in NAMES:
    _cls = type(_class_name(_name), (Error,), {"name": _name, "__doc__": f"kvsim error {_name} (docs/errors.md)."})
    _CLASSES[_name] = _cls
    globals()[_cls.__name__] = _cls


def error_class(name):
    """The Error subclass for a C++ error name (used by the extension)."""
    return _CLASSES.get(name, Error)


__all__ = ["Error", "error_class"] + [c.__name__ for c in _CLASSES.values()]
