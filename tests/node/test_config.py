"""Config precedence (flag > env > TOML > default), sections, errors that name the key, and
sections that take the keys they tune from the protocol configs they feed."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from node.config import Config, ConfigError, default_toml, load_config
from node.daemon import LIGHT_PROFILE, config_sections, light_services, load_service_classes
from node.sections import fed_config, feed, tuning


@dataclass(frozen=True)
class LedgerSection:
    max_records: int = 1000
    sync_interval_s: float = 5.0
    seeds: tuple[str, ...] = ()


SECTIONS = {"ledger": LedgerSection}
#: well-formed peer ids (bootstrap addresses must name one)
X, Y = "12D3KooWSrKnMZUcSxK8G7wmBbXdU8nFEfWGhLu6H8xjn8LmCSJb", "12D3KooWENTLiCwwoVwYNbKFEfmNdyHG1jxNn9oPB29JeeZXWjAb"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


def load(data_dir: Path, flags: dict[str, object] | None = None,
         env: dict[str, str] | None = None, **kw: object) -> Config:
    return load_config({"data_dir": data_dir, **(flags or {})}, env=env or {},
                       sections=SECTIONS, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("toml", "env", "flag", "expected"),
    [
        (None, None, None, 8),  # default
        ("target_peers = 3", None, None, 3),  # TOML over default
        ("target_peers = 3", "5", None, 5),  # env over TOML
        ("target_peers = 3", "5", 7, 7),  # flag over env
        (None, None, 0, 0),  # a falsy flag still counts
    ],
)
def test_precedence_flag_env_toml_default(data_dir: Path, toml: str | None, env: str | None,
                                          flag: int | None, expected: int) -> None:
    if toml is not None:
        write(data_dir / "node.toml", toml)
    config = load(data_dir, {"target_peers": flag},
                  {"SYMPHONY_TARGET_PEERS": env} if env is not None else {})
    assert config.target_peers == expected


def test_every_top_level_key_from_each_layer(data_dir: Path) -> None:
    write(data_dir / "node.toml", """
listen = ["/ip4/127.0.0.1/tcp/0"]
bootstrap = ["/ip4/127.0.0.1/tcp/9/p2p/12D3KooWB8sCGZCrwr79HtabLAn95qyPQx6RYHXjEbiD6QKou7ww"]
network_id = "from-toml"
api_port = 8123
log_level = "debug"
json_logs = true
""")
    config = load(data_dir, {"listen": ("/ip4/127.0.0.1/tcp/5",)},
                  {"SYMPHONY_NETWORK_ID": "from-env", "SYMPHONY_JSON_LOGS": "false",
                   "SYMPHONY_BOOTSTRAP": f"/ip4/1.2.3.4/tcp/1/p2p/{X},/ip4/1.2.3.4/tcp/2/p2p/{Y}"})
    assert config.listen == ("/ip4/127.0.0.1/tcp/5",)
    assert config.bootstrap == (f"/ip4/1.2.3.4/tcp/1/p2p/{X}", f"/ip4/1.2.3.4/tcp/2/p2p/{Y}")
    assert config.network_id == "from-env"
    assert config.json_logs is False
    assert (config.api_port, config.log_level) == (8123, "debug")
    assert config.data_dir == data_dir


def test_data_dir_from_env_locates_the_toml_file(tmp_path: Path) -> None:
    d = tmp_path / "envdir"
    d.mkdir()
    write(d / "node.toml", "target_peers = 2")
    config = load_config(env={"SYMPHONY_DATA_DIR": str(d)}, sections=SECTIONS)
    assert (config.data_dir, config.target_peers) == (d, 2)


def test_explicit_config_file_is_read_and_must_exist(data_dir: Path, tmp_path: Path) -> None:
    path = write(tmp_path / "other.toml", 'network_id = "alt"')
    assert load(data_dir, config_file=path).network_id == "alt"
    with pytest.raises(ConfigError, match="does not exist"):
        load(data_dir, config_file=tmp_path / "missing.toml")


def test_unknown_top_level_key_is_an_error_naming_it(data_dir: Path) -> None:
    write(data_dir / "node.toml", "target_peer = 3")
    with pytest.raises(ConfigError, match="unknown key 'target_peer'"):
        load(data_dir)


def test_unknown_section_is_an_error_naming_it(data_dir: Path) -> None:
    write(data_dir / "node.toml", "[ledgr]\nmax_records = 1")
    with pytest.raises(ConfigError, match="unknown key 'ledgr'"):
        load(data_dir)


def test_unknown_key_inside_a_section_is_an_error_naming_it(data_dir: Path) -> None:
    write(data_dir / "node.toml", "[ledger]\nmax_record = 1")
    with pytest.raises(ConfigError, match=r"unknown key 'max_record' in section \[ledger\]"):
        load(data_dir)
    (data_dir / "node.toml").unlink()
    with pytest.raises(ConfigError, match="SYMPHONY_LEDGER__NOPE"):
        load(data_dir, env={"SYMPHONY_LEDGER__NOPE": "1"})


def test_sections_take_defaults_toml_and_env(data_dir: Path) -> None:
    assert load(data_dir).section("ledger") == LedgerSection()
    write(data_dir / "node.toml", "[ledger]\nmax_records = 5\nseeds = ['a']\nsync_interval_s = 2")
    config = load(data_dir, env={"SYMPHONY_LEDGER__MAX_RECORDS": "9"})
    assert config.section("ledger") == LedgerSection(max_records=9, sync_interval_s=2.0,
                                                     seeds=("a",))
    with pytest.raises(KeyError, match="no config section 'tasks'"):
        config.section("tasks")


@pytest.mark.parametrize(
    ("toml", "env", "message"),
    [
        ("target_peers = 'many'", {}, "key 'target_peers': 'many' is not an integer"),
        ("target_peers = true", {}, "key 'target_peers': True is not an integer"),
        ("", {"SYMPHONY_TARGET_PEERS": "x"}, "SYMPHONY_TARGET_PEERS: key 'target_peers'"),
        ("target_peers = -1", {}, "key 'target_peers': -1 is not within"),
        ("api_port = 70000", {}, "key 'api_port': 70000 is not a port"),
        ("log_level = 'loud'", {}, "key 'log_level': 'loud' is not one of"),
        ("json_logs = 'maybe'", {}, "key 'json_logs': 'maybe' is not a boolean"),
        ("listen = [1]", {}, "key 'listen': [1] is not a list of strings"),
        ("listen = ['tcp/1']", {}, "key 'listen': 'tcp/1' is not a multiaddr"),
        ("network_id = 'Bad Net'", {}, "key 'network_id'"),
        ("bootstrap = ['/ip4/1.2.3.4/tcp/1']", {}, "must end in /p2p/"),
        ("bootstrap = ['/ip4/1.2.3.4/tcp/1/p2p/not-a-peer']", {},
         "key 'bootstrap': '/ip4/1.2.3.4/tcp/1/p2p/not-a-peer' is not a multiaddr: Invalid CID"),
        ("listen = ['/ip4/1.2.3.4/tcp/65536']", {}, "is not a multiaddr: integer not in range"),
        ("[ledger]\nmax_records = 'lots'", {}, "key 'ledger.max_records': 'lots'"),
        ("target_peers = ", {}, "cannot read config file"),
    ],
)
def test_bad_values_name_the_key_and_value(data_dir: Path, toml: str, env: dict[str, str],
                                           message: str) -> None:
    write(data_dir / "node.toml", toml)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(data_dir, env=env)


def test_unrelated_symphony_env_vars_are_ignored(data_dir: Path) -> None:
    config = load(data_dir, env={"SYMPHONY_SOMETHING_ELSE": "1", "SYMPHONY_OTHER__X": "2"})
    assert config == load(data_dir)


def test_the_first_run_template_loads_to_the_defaults(data_dir: Path) -> None:
    write(data_dir / "node.toml", default_toml(SECTIONS))
    assert "# [ledger]" in (data_dir / "node.toml").read_text()
    assert load(data_dir) == Config(data_dir=data_dir, sections={"ledger": LedgerSection()})


@dataclass(frozen=True)
class SyncConfig:
    """Stands for a protocol config: two tunables and one value only the node knows."""

    peer: str
    fanout: int = 2
    timeout_ms: int = 10_000


@tuning(SyncConfig, "fanout", "timeout_ms")
class SyncSection:
    poll_ms: int = 1_000


def test_a_section_takes_the_fields_it_tunes_from_the_protocol_config() -> None:
    assert [(f.name, f.type, f.default) for f in dataclasses.fields(SyncSection)] == [
        ("poll_ms", "int", 1_000), ("fanout", int, 2), ("timeout_ms", int, 10_000)]
    assert SyncSection.node_fields == ("poll_ms",) and SyncSection.feeds is SyncConfig
    with pytest.raises(dataclasses.FrozenInstanceError):
        SyncSection().fanout = 3  # type: ignore[misc]


def test_a_section_feeds_its_protocol_config_every_field_but_the_nodes_own(data_dir: Path) -> None:
    fed = fed_config(SyncSection(fanout=5, timeout_ms=7, poll_ms=9), peer="me")
    assert fed == SyncConfig(peer="me", fanout=5, timeout_ms=7)
    write(data_dir / "node.toml", "[sync]\nfanout = 4\n")
    config = load_config({"data_dir": data_dir}, env={"SYMPHONY_SYNC__TIMEOUT_MS": "70"},
                         sections={"sync": SyncSection})
    assert fed_config(config.section("sync"), peer="me") == SyncConfig(
        peer="me", fanout=4, timeout_ms=70)
    with pytest.raises(ConfigError, match=r"key 'sync.fanout': 'many' is not an integer"):
        load_config({"data_dir": data_dir}, env={"SYMPHONY_SYNC__FANOUT": "many"},
                    sections={"sync": SyncSection})


@dataclass(frozen=True)
class PlanConfig:
    tries: int = 2
    width: int = 3


@tuning(SyncConfig, "fanout", also=feed(PlanConfig, "width", plan_tries="tries"))
class TwoFeedSection:
    poll_ms: int = 1_000


def test_a_section_may_feed_a_second_protocol_config_under_its_own_key_names() -> None:
    assert [f.name for f in dataclasses.fields(TwoFeedSection)] == [
        "poll_ms", "fanout", "width", "plan_tries"]
    section = TwoFeedSection(fanout=4, width=5, plan_tries=6)
    assert fed_config(section, peer="me") == SyncConfig(peer="me", fanout=4)
    assert fed_config(section, PlanConfig) == PlanConfig(tries=6, width=5)
    with pytest.raises(TypeError, match=re.escape("PlanConfig has no field(s) ['depth']")):
        tuning(SyncConfig, "fanout", also=feed(PlanConfig, plan_depth="depth"))


@tuning(SyncConfig, "fanout")
class OwnPeerSection:
    #: the node's own key, named like SyncConfig.peer, which the node sets (it has no default)
    peer: str = "any"


def test_a_key_named_like_a_field_the_node_sets_is_the_nodes_own() -> None:
    section = OwnPeerSection(peer="x", fanout=3)
    assert OwnPeerSection.node_fields == ("peer",)
    assert fed_config(section, peer="me") == SyncConfig(peer="me", fanout=3)


def _own_fanout() -> None:
    @tuning(SyncConfig, "timeout_ms")
    class Shadowing:
        fanout: int = 2


@pytest.mark.parametrize(
    ("declare", "problem"),
    [
        (lambda: tuning(SyncConfig, "fan_out"), "SyncConfig has no field(s) ['fan_out']"),
        (lambda: tuning(SyncConfig, "peer")(type("S", (), {})),
         "SyncConfig.peer has no default: the node sets it"),
        (_own_fanout, "Shadowing: ['fanout'] are fields of SyncConfig"),
    ],
)
def test_a_section_cannot_restate_or_misname_a_protocol_field(
        declare: Callable[[], object], problem: str) -> None:
    with pytest.raises(TypeError, match=re.escape(problem)):
        declare()


#: the keys of the daemon's sections that tune protocol configs (TOML keys and env variables)
TUNED_KEYS = {
    "ledger": ["roles", "tags", "price_per_1k_tokens", "capability_poll_ms", "agent_embeddings",
               "record_ttl_ms", "refresh_ms", "min_republish_ms", "attestation_ttl_ms", "anti_entropy_ms",
               "sync_fanout", "sync_timeout_ms", "attestation_rate_per_minute"],
    "tasks": ["selector", "linucb_alpha", "linucb_lambda", "default_k", "default_deadline_ms",
              "default_max_tokens", "default_max_price", "bid_window_ms", "spare_bids",
              "max_rounds", "backoff_base_ms", "backoff_max_ms", "min_round_ms",
              "assign_base_ms", "assign_slack", "planners", "plan_tokens", "plan_step_tries",
              "plan_replans"],
    "executor": ["solver", "model", "threads", "price_per_1k", "slots", "queue", "hold_ms",
                 "max_tokens", "max_task_ms", "max_question_chars"],
    "membership": ["mdns", "discovery", "discovery_records_per_peer", "discovery_record_ttl_ms",
                   "discovery_queries_per_minute", "hello_timeout_ms", "ping_interval_ms",
                   "unresponsive_after_ms", "exchange_interval_ms", "backoff_base_ms",
                   "backoff_max_ms", "refused_backoff_ms", "peer_exchange"],
    "verify": ["enabled", "verifier", "model", "slots", "sample_rate", "verifiers", "panel",
               "max_escalations", "chunks_per_check", "commit_window_ms", "reveal_ms",
               "check_timeout_ms", "exclusion_ms", "require_fingerprints"],
}


def test_the_daemons_sections_keep_their_keys() -> None:
    sections = config_sections(load_service_classes())
    assert {name: [f.name for f in dataclasses.fields(sections[name])]
            for name in TUNED_KEYS} == TUNED_KEYS


@pytest.mark.parametrize(
    ("toml", "env", "expected"),
    [
        (None, None, 9.0),  # the profile over the section's default
        ("[ledger]\nsync_interval_s = 2.0", None, 2.0),  # TOML over the profile
        ("[ledger]\nsync_interval_s = 2.0", "3.0", 3.0),  # env over both
    ],
)
def test_a_profile_sits_between_the_defaults_and_the_file(
        data_dir: Path, toml: str | None, env: str | None, expected: float) -> None:
    if toml is not None:
        write(data_dir / "node.toml", toml)
    config = load(data_dir, env={"SYMPHONY_LEDGER__SYNC_INTERVAL_S": env} if env else None,
                  profile={"ledger": {"sync_interval_s": 9.0}})
    assert config.section("ledger").sync_interval_s == expected
    assert config.section("ledger").max_records == 1000  # keys it leaves alone keep defaults


@pytest.mark.parametrize("profile", [{"ledger": {"nope": 1}}, {"nope": {"max_records": 1}}])
def test_a_profile_naming_an_unknown_key_or_section_is_an_error(
        data_dir: Path, profile: dict[str, dict[str, object]]) -> None:
    with pytest.raises(ConfigError, match="profile: unknown section or key"):
        load(data_dir, profile=profile)


def test_the_light_profile_names_only_keys_a_light_daemon_has(data_dir: Path) -> None:
    sections = config_sections(load_service_classes(light_services()))
    config = load_config({"data_dir": data_dir}, env={}, sections=sections,
                         profile=LIGHT_PROFILE)
    for name, keys in LIGHT_PROFILE.items():
        for key, value in keys.items():
            assert getattr(config.section(name), key) == value, (name, key)
