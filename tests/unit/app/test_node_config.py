"""Node config rules of the security issue: where the Raft password comes from,
when a cluster must have one, and the [tls] table."""
from __future__ import annotations

from pathlib import Path

import pytest

from node.app.config import (
    NO_CLUSTER_PASSWORD,
    ConfigError,
    NodeConfig,
    apply_env,
    check_cluster_password,
    check_http_tls,
    check_tls,
)
from node.app.config_file import apply_file


def cfg_from(tmp_path: Path, text: str) -> NodeConfig:
    path = tmp_path / "node.toml"
    path.write_text(text)
    cfg = NodeConfig(node_id="n1", data_dir=str(tmp_path / "d"))
    apply_file(cfg, str(path))
    return cfg


def test_single_node_needs_no_password() -> None:
    check_cluster_password(NodeConfig(node_id="n1", data_dir="d"))


@pytest.mark.parametrize("peers,join", [({"n2": "127.0.0.1:1"}, False), ({}, True)])
def test_cluster_without_password_is_refused_unless_insecure_dev(peers: dict[str, str],
                                                                 join: bool) -> None:
    cfg = NodeConfig(node_id="n1", data_dir="d")
    cfg.raft.peers, cfg.raft.join = peers, join
    with pytest.raises(ConfigError) as err:
        check_cluster_password(cfg)
    assert str(err.value) == NO_CLUSTER_PASSWORD and "\n" not in str(err.value)
    cfg.insecure_dev = True
    check_cluster_password(cfg)
    cfg.insecure_dev, cfg.raft.password = False, "s3cret"
    check_cluster_password(cfg)


def test_password_file_relative_to_the_config_and_newline_stripped(tmp_path: Path) -> None:
    (tmp_path / "raft.pw").write_text("s3cret\n")
    assert cfg_from(tmp_path, '[raft]\npassword_file = "raft.pw"\n').raft.password == "s3cret"


@pytest.mark.parametrize("text,needle", [
    ('[raft]\npassword_file = "missing.pw"\n', "cannot read raft.password_file"),
    ('[raft]\npassword_file = "empty.pw"\n', "is empty"),
    ('[raft]\npassword = "a"\npassword_file = "empty.pw"\n', "not both"),
    ('[raft]\npassword = ""\n', "non-empty"),
    ('[tls]\nverify = "peer"\n', "tls.verify must be one of"),
    ('[tls]\nport = 0\n', "tls.port"),
    ('[tls]\nonly = "yes"\n', "tls.only"),
    ('[tls]\nciphers = "x"\n', "unknown key tls.ciphers"),
])
def test_bad_security_config(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "empty.pw").write_text("\n")
    with pytest.raises(ConfigError, match=needle):
        cfg_from(tmp_path, text)


def test_env_password_wins_over_the_file(tmp_path: Path) -> None:
    cfg = cfg_from(tmp_path, '[raft]\npassword = "from-file"\n')
    apply_env(cfg, {})
    assert cfg.raft.password == "from-file"
    apply_env(cfg, {"MIRRORQ_RAFT_PASSWORD": ""})  # empty = unset
    assert cfg.raft.password == "from-file"
    apply_env(cfg, {"MIRRORQ_RAFT_PASSWORD": "from-env"})
    assert cfg.raft.password == "from-env"


def test_env_default_user_replaces_the_config_users(tmp_path: Path) -> None:
    cfg = cfg_from(tmp_path, '[users]\nalice = "a"\nbob = "b"\n')
    apply_env(cfg, {})
    assert cfg.wire.users == {"alice": "a", "bob": "b"}
    apply_env(cfg, {"MIRRORQ_DEFAULT_USER": "", "MIRRORQ_DEFAULT_PASS": ""})  # empty = unset
    assert cfg.wire.users == {"alice": "a", "bob": "b"}
    apply_env(cfg, {"MIRRORQ_DEFAULT_USER": "mirrorq", "MIRRORQ_DEFAULT_PASS": "pw"})
    assert cfg.wire.users == {"mirrorq": "pw"}  # the only user
    default = NodeConfig(node_id="n1", data_dir="d")
    apply_env(default, {"MIRRORQ_DEFAULT_USER": "mirrorq", "MIRRORQ_DEFAULT_PASS": "pw"})
    assert default.wire.users == {"mirrorq": "pw"}


@pytest.mark.parametrize("env,missing", [
    ({"MIRRORQ_DEFAULT_USER": "mirrorq"}, "MIRRORQ_DEFAULT_PASS"),
    ({"MIRRORQ_DEFAULT_USER": "mirrorq", "MIRRORQ_DEFAULT_PASS": ""}, "MIRRORQ_DEFAULT_PASS"),
    ({"MIRRORQ_DEFAULT_PASS": "pw"}, "MIRRORQ_DEFAULT_USER"),
    ({"MIRRORQ_DEFAULT_USER": "", "MIRRORQ_DEFAULT_PASS": "pw"}, "MIRRORQ_DEFAULT_USER"),
])
def test_env_default_user_without_its_password_is_refused(env: dict[str, str],
                                                          missing: str) -> None:
    cfg = NodeConfig(node_id="n1", data_dir="d")
    before = dict(cfg.wire.users)
    with pytest.raises(ConfigError) as err:
        apply_env(cfg, env)
    assert f"{missing} is unset or empty" in str(err.value) and "\n" not in str(err.value)
    assert cfg.wire.users == before


def test_env_admin_token_wins_over_the_file(tmp_path: Path) -> None:
    cfg = cfg_from(tmp_path, '[admin]\ntoken = "from-file"\n')
    apply_env(cfg, {"MIRRORQ_ADMIN_TOKEN": ""})  # empty = unset
    assert cfg.admin.token == "from-file"
    apply_env(cfg, {"MIRRORQ_ADMIN_TOKEN": "0123abcd"})
    assert cfg.admin.token == "0123abcd"
    bare = NodeConfig(node_id="n1", data_dir="d")
    apply_env(bare, {})
    assert bare.admin.token is None
    apply_env(bare, {"MIRRORQ_ADMIN_TOKEN": "t0k-en"})
    assert bare.admin.token == "t0k-en"


@pytest.mark.parametrize("token", ["two words", "tab\there", "new\nline", "caf\u00e9"])
def test_env_admin_token_follows_the_file_rule(tmp_path: Path, token: str) -> None:
    with pytest.raises(ConfigError, match="MIRRORQ_ADMIN_TOKEN must be non-empty printable ASCII"):
        apply_env(NodeConfig(node_id="n1", data_dir="d"), {"MIRRORQ_ADMIN_TOKEN": token})
    # the same rule (one helper) for [admin] token in the file
    quoted = token.replace("\t", "\\t").replace("\n", "\\n")
    with pytest.raises(ConfigError, match="admin token must be non-empty printable ASCII"):
        cfg_from(tmp_path, f'[admin]\ntoken = "{quoted}"\n')


def test_env_config_error_is_exit_2_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from node.app.main import EXIT_USAGE, main
    monkeypatch.setenv("MIRRORQ_DEFAULT_USER", "mirrorq")
    monkeypatch.delenv("MIRRORQ_DEFAULT_PASS", raising=False)
    code = main(["serve", "--node-id", "n1", "--data-dir", str(tmp_path / "d"),
                 "--amqp-port", "5672"])
    assert code == EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert err.startswith("mirrorq: error: MIRRORQ_DEFAULT_USER is set but MIRRORQ_DEFAULT_PASS")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_tls_paths_relative_to_the_config(tmp_path: Path) -> None:
    cfg = cfg_from(tmp_path, '[tls]\nport = 5671\ncert = "c.pem"\nkey = "/abs/k.pem"\n'
                             'verify = "required"\nonly = true\n')
    t = cfg.tls
    assert (t.port, t.cert, t.key, t.verify, t.only) == (5671, str(tmp_path / "c.pem"), "/abs/k.pem",
                                                        "required", True)


def test_tls_needs_a_port_and_a_port_needs_files() -> None:
    cfg = NodeConfig(node_id="n1", data_dir="d")
    check_tls(cfg)  # no [tls]: nothing to do
    assert cfg.amqps_context is None
    cfg.tls.only = True
    with pytest.raises(ConfigError, match="tls.only needs an amqps port"):
        check_tls(cfg)
    cfg.tls.only, cfg.tls.cert = False, "/x.pem"
    with pytest.raises(ConfigError, match="no amqps port"):
        check_tls(cfg)
    cfg.tls.cert, cfg.tls.port = "", 5671
    with pytest.raises(ConfigError, match="needs tls.cert"):
        check_tls(cfg)


def test_https_listener_ports_and_certificate(tmp_path: Path) -> None:
    """Issue 26: [http] tls_port is HTTPS beside the plain port (tls_only: alone),
    on [http]'s certificate or else [tls]'s; [http] tls_cert without tls_port
    keeps making `port` itself HTTPS (as before)."""
    from node.app.pki import make_ca, make_member
    make_ca(tmp_path / "pki")
    cert, key = make_member(tmp_path / "pki", "s", ["127.0.0.1"])
    cfg = cfg_from(tmp_path, "[http]\nport = 15672\ntls_port = 15671\n")
    with pytest.raises(ConfigError, match=r"needs \[http\] tls_cert and tls_key, or \[tls\]"):
        check_http_tls(cfg)
    cfg.tls.cert, cfg.tls.key = str(cert), str(key)
    check_http_tls(cfg)
    assert cfg.https_context is not None and cfg.http.tls_cert == str(cert)
    assert (cfg.http.plain_port(), cfg.http.https_port()) == (15672, 15671)
    cfg.http.tls_only = True
    assert (cfg.http.plain_port(), cfg.http.https_port()) == (None, 15671)
    legacy = cfg_from(tmp_path, f'[http]\nport = 15672\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    check_http_tls(legacy)
    assert (legacy.http.plain_port(), legacy.http.https_port()) == (None, 15672)
    only = cfg_from(tmp_path, "[http]\nport = 15672\ntls_only = true\n")
    with pytest.raises(ConfigError, match="tls_only needs an HTTPS port"):
        check_http_tls(only)
    with pytest.raises(ConfigError, match="tls_only must be true or false"):
        cfg_from(tmp_path, '[http]\ntls_only = "yes"\n')
    bad = cfg_from(tmp_path, "[http]\ntls_port = 15671\n")
    bad.tls.cert, bad.tls.key = str(cert), str(tmp_path / "missing.key")
    with pytest.raises(ConfigError, match=r"http TLS \(from \[tls\] cert/key\): cannot read http.tls_key"):
        check_http_tls(bad)


def test_peer_common_name() -> None:
    from node.amqp.tls import peer_common_name
    cert = {"subject": ((("organizationName", "acme"),), (("commonName", "alice"),))}
    assert peer_common_name(cert) == "alice"
    assert peer_common_name({}) is None and peer_common_name(None) is None


def test_http_target_cluster_size_hint_defaults_to_one_as_rabbitmq(tmp_path: Path) -> None:
    assert cfg_from(tmp_path, '[http]\nport = 15672\n').http.target_cluster_size_hint == 1
    cfg = cfg_from(tmp_path, '[http]\ntarget_cluster_size_hint = 3\n')
    assert cfg.http.target_cluster_size_hint == 3
    for bad in ("0", '"3"', "true"):
        with pytest.raises(ConfigError, match="target_cluster_size_hint"):
            cfg_from(tmp_path, f'[http]\ntarget_cluster_size_hint = {bad}\n')


def test_http_member_urls(tmp_path: Path) -> None:
    cfg = cfg_from(tmp_path, '[http]\nport = 15672\n'
                             'member_urls = { n2 = "http://h2:15672/", n3 = "https://h3:15672/" }\n')
    assert cfg.http.member_urls == {"n2": "http://h2:15672/", "n3": "https://h3:15672/"}
    from node.app.node import _member_urls
    assert _member_urls(cfg)["n1"] == "http://127.0.0.1:15672/"  # its own, from its port
    with pytest.raises(ConfigError, match="member_urls"):
        cfg_from(tmp_path, '[http]\nmember_urls = { n2 = "h2:15672" }\n')
    from node.app.main import build_parser, config_from_args
    args = build_parser().parse_args([
        "serve", "--node-id", "n1", "--data-dir", str(tmp_path / "d"), "--amqp-port", "5672",
        "--http-port", "15672", "--http-member-url", "n2=http://h2:15673/"])
    assert config_from_args(args).http.member_urls == {"n2": "http://h2:15673/"}


def test_catch_up_hold_bytes_is_read_and_may_not_undercut_compaction(tmp_path: Path) -> None:
    from node.app.config_file import validate
    cfg = cfg_from(tmp_path, "[raft]\ncatch_up_hold_bytes = 536870912\n")
    assert cfg.raft.catch_up_hold_bytes == 512 * 1024 * 1024
    validate(cfg)
    with pytest.raises(ConfigError, match="catch_up_hold_bytes must be at least raft.compaction_max_bytes"):
        cfg_from(tmp_path, "[raft]\ncatch_up_hold_bytes = 1048576\n")


def test_policy_and_parameter_bounds_are_read_and_checked(tmp_path: Path) -> None:
    from node.broker.definition_limit import CEILING_POLICIES, DefinitionLimits
    assert cfg_from(tmp_path, "").definitions == DefinitionLimits()
    cfg = cfg_from(tmp_path, "max_policies_per_vhost = 50\nmax_parameter_bytes = 1024\n")
    assert cfg.definitions.max_policies_per_vhost == 50
    assert cfg.definitions.max_parameter_bytes == 1024
    for bad in ("0", f"{CEILING_POLICIES + 1}", '"50"', "true"):
        with pytest.raises(ConfigError, match="max_policies_per_vhost"):
            cfg_from(tmp_path, f"max_policies_per_vhost = {bad}\n")
    with pytest.raises(ConfigError, match="max_policy_pattern_length"):
        cfg_from(tmp_path, "max_policy_pattern_length = 1001\n")


def test_http_read_limits_have_safe_defaults_and_are_checked(tmp_path: Path) -> None:
    """Issue 42: requests in flight per user and the shared rows' spacing."""
    http = cfg_from(tmp_path, "[http]\nport = 15672\n").http
    assert (http.max_requests_per_user, http.rows_min_interval, http.rows_max_share) \
        == (8, 0.05, 0.1)
    http = cfg_from(tmp_path, "[http]\nmax_requests_per_user = 0\nrows_min_interval = 1\n"
                              "rows_max_share = 0.5\n").http
    assert (http.max_requests_per_user, http.rows_min_interval, http.rows_max_share) \
        == (0, 1.0, 0.5)
    for bad in ("max_requests_per_user = -1", 'max_requests_per_user = "8"',
                "rows_min_interval = 61", "rows_min_interval = true", "rows_max_share = 0",
                "rows_max_share = 1.5"):
        with pytest.raises(ConfigError, match=bad.split(" ")[0]):
            cfg_from(tmp_path, f"[http]\n{bad}\n")


def test_metrics_table(tmp_path: Path) -> None:
    """Issue 42: aggregated by default, per-object opt-in, an optional token."""
    m = cfg_from(tmp_path, "[http]\nport = 15672\n").metrics
    assert (m.return_per_object_metrics, m.per_object_endpoint, m.token, m.max_scrapes) \
        == (False, False, None, 4)
    (tmp_path / "metrics.token").write_text("s3cret\n")
    m = cfg_from(tmp_path, '[metrics]\nreturn_per_object_metrics = true\n'
                           'per_object_endpoint = true\ntoken_file = "metrics.token"\n'
                           'max_scrapes = 2\n').metrics
    assert (m.return_per_object_metrics, m.per_object_endpoint, m.token, m.max_scrapes) \
        == (True, True, "s3cret", 2)
    for bad, needle in (('return_per_object_metrics = "yes"', "return_per_object_metrics"),
                        ('token = ""', "metrics.token"),
                        ('token = "a"\ntoken_file = "metrics.token"', "not both"),
                        ('token_file = "absent"', "metrics.token_file"),
                        ("max_scrapes = 0", "max_scrapes"), ("other = 1", "metrics.other")):
        with pytest.raises(ConfigError, match=needle):
            cfg_from(tmp_path, f"[metrics]\n{bad}\n")


def test_raft_max_frame_bytes_is_read_and_must_hold_the_largest_append(tmp_path: Path) -> None:
    from node.replication.config import min_frame_bytes
    # issue 42 item 10: the Raft frame bound (was a fixed 1 GiB) is a setting with a floor
    assert cfg_from(tmp_path, "").raft.max_frame_bytes == 64 * 1024 * 1024
    assert cfg_from(tmp_path, "[raft]\nmax_frame_bytes = 33554432\n").raft.max_frame_bytes == 32 << 20
    with pytest.raises(ConfigError, match="raft.max_frame_bytes must be at least"):
        cfg_from(tmp_path, "[raft]\nmax_frame_bytes = 16777216\n")  # under max_message_size (16 MiB)
    # unset, it grows with a larger max_message_size (a node.toml of 3.x's 128 MiB still starts)
    assert cfg_from(tmp_path, "max_message_size = 134217728\n").raft.max_frame_bytes == \
        min_frame_bytes(128 << 20, 512 << 10, 512 << 10)
    with pytest.raises(ConfigError, match="raft.max_frame_bytes must be at least"):
        cfg_from(tmp_path, "max_message_size = 134217728\n[raft]\nmax_frame_bytes = 67108864\n")


def test_raft_tls_verify_names_is_a_boolean(tmp_path: Path) -> None:
    assert cfg_from(tmp_path, "").raft.tls_verify_names is True
    assert cfg_from(tmp_path, "[raft]\ntls_verify_names = false\n").raft.tls_verify_names is False
    with pytest.raises(ConfigError, match="tls_verify_names must be true or false"):
        cfg_from(tmp_path, "[raft]\ntls_verify_names = 0\n")
