import pytest

from node import plugins

BUILTINS = {"paths": "os.path:join"}


@pytest.mark.parametrize("value", ["", "paths", "os.path:join"])
def test_none_a_builtin_or_module_attr_is_a_choice(value: str) -> None:
    plugins.check_choice("solver", value, BUILTINS)


@pytest.mark.parametrize("value", ["os.path", ":join", "os.path:", "nope"])
def test_anything_else_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ValueError, match=r"solver .* is neither one of \['paths'\]"):
        plugins.check_choice("solver", value, BUILTINS)


def test_load_resolves_a_builtin_name_then_imports() -> None:
    import os.path

    assert plugins.load("paths", BUILTINS) is os.path.join
    assert plugins.load("os.path:join") is os.path.join
    with pytest.raises(AttributeError):
        plugins.load("os.path:no_such_name")
