"""The ``[[agents]]`` tables of node.toml: the issue's fixed format parses, every other key
and a model the node does not serve are errors naming them, and a node with none hosts the
generalist on its model."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.agents.config import (
    GENERALIST,
    AgentConfigError,
    AgentSpec,
    hosted_agents,
    parse_agents,
)
from node.config import ConfigError, load_config
from protocol.agents.cards import MAX_AGENTS_PER_NODE

#: the format the issue fixes, because other tools write it
FIXED = '''
[[agents]]
name = "calc"
description = "Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly."
skills = ["arithmetic", "math"]
tools = ["calculator"]          # a built-in tool by name; MCP servers have their own table
'''


def load(tmp_path: Path, text: str) -> tuple[AgentSpec, ...]:
    (tmp_path / "node.toml").write_text(text)
    return load_config({"data_dir": tmp_path}, env={}).agents


def test_the_fixed_format_parses(tmp_path: Path) -> None:
    (calc,) = load(tmp_path, FIXED)
    assert calc == AgentSpec(
        name="calc",
        description="Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly.",
        skills=("arithmetic", "math"), tools=("calculator",))
    assert calc.model is None and calc.adapter is None and calc.price is None


def test_every_key(tmp_path: Path) -> None:
    adapter = tmp_path / "calc-lora.gguf"
    adapter.write_bytes(b"lora")
    text = FIXED + f'''
[[agents]]
name = "poet"
description = "Writes short poems."
skills = ["Poetry", "writing"]
model = "smollm2"
adapter = "{adapter}"
system_prompt = "You write verse."
tools = []
price = 2
'''
    calc, poet = load(tmp_path, text)
    assert poet.skills == ("poetry", "writing")  # tags compare in lower case
    assert poet.model == "smollm2" and poet.adapter_path == adapter
    assert poet.system_prompt == "You write verse." and poet.price == 2.0
    assert load(tmp_path, 'serve_blocks = ""\n') == ()  # no [[agents]]: none declared
    relay = parse_agents([{"name": "a", "description": "d", "adapter": "calc-lora"}], "t")
    assert relay[0].adapter == "calc-lora" and relay[0].adapter_path is None


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ('prompt = "x"', "'prompt'"),  # an unknown key
        ('skills = "math"', "'skills'"),  # not a list
        ('tools = ["rm -rf"]', "'tools'"),
        ('price = -1', "'price'"),
        ('price = true', "'price'"),
        ('model = ""', "'model'"),
        ('adapter = "/no/such/file.gguf"', "'adapter'"),
        ('skills = ["math", "Math"]', "'skills'"),
    ],
)
def test_a_wrong_key_is_an_error_naming_it(tmp_path: Path, table: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named) as err:
        load(tmp_path, f'[[agents]]\nname = "calc"\ndescription = "d"\n{table}\n')
    assert "calc" in str(err.value)  # and the agent


def test_whole_array_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'name' is missing"):
        load(tmp_path, '[[agents]]\ndescription = "x"\n')
    with pytest.raises(ConfigError, match="'calc' is declared twice"):
        load(tmp_path, FIXED + FIXED)
    with pytest.raises(ConfigError, match=f"at most {MAX_AGENTS_PER_NODE} agents"):
        load(tmp_path, "".join(FIXED.replace('"calc"', f'"c{i}"')
                               for i in range(MAX_AGENTS_PER_NODE + 1)))
    with pytest.raises(ConfigError, match="array of tables"):
        load(tmp_path, '[agents]\nname = "calc"\n')
    with pytest.raises(ConfigError, match="'bad name'"):
        load(tmp_path, FIXED.replace('"calc"', '"bad name"'))


def test_hosted_agents_resolve_models_and_default_to_the_generalist() -> None:
    (calc,) = parse_agents([{"name": "calc", "description": "d"}], "t")
    assert hosted_agents([calc], ["m1", "m2"])[0].model == "m1"  # the node's model
    (general,) = hosted_agents([], ["m1"])
    assert general.name == GENERALIST.name == "generalist" and general.model == "m1"
    assert general.skills == ("general", "reasoning", "planning") and general.tools == ()
    assert hosted_agents([calc], []) == ()  # a node that serves no model hosts no agent
    (on_m2,) = parse_agents([{"name": "c", "description": "d", "model": "m2"}], "t")
    assert hosted_agents([on_m2], ["m1", "m2"])[0].model == "m2"
    with pytest.raises(AgentConfigError, match="'nope' is not a model this node serves"):
        hosted_agents(parse_agents([{"name": "c", "description": "d", "model": "nope"}], "t"),
                      ["m1"])
