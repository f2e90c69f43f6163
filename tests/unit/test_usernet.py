"""A worker that is not root (`bashfleet.worker.engine.network.usernet`), the pure parts: pasta's
command line, the host's addresses the rules refuse, the state kept, what the host
grants when it cannot give `egress` or `allow`."""

from __future__ import annotations

import pytest

from bashfleet.worker.engine import sandbox
from bashfleet.worker.engine.network import network, usernet
from bashfleet.worker.engine.sandbox import Choice, IsolationError, NetworkRules
from bashfleet.worker.wire.network import NetworkPolicy

E, N, H = NetworkPolicy(mode="egress"), NetworkPolicy(mode="none"), NetworkPolicy(mode="host")
A = NetworkPolicy(mode="allow", allow=("pypi.org",))


def test_pasta_never_maps_the_hosts_loopback_nor_forwards_a_port() -> None:
    argv = usernet.pasta_argv("/usr/bin/pasta", ready=9, netns=7, userns=5)
    assert argv[0] == "/usr/bin/pasta"
    assert "--no-map-gw" in argv  # the gateway is not the host's 127.0.0.1
    pairs = {(argv[i], argv[i + 1]) for i in range(len(argv) - 1)}
    # No port of the namespace forwards to the host's loopback (-T/-U), none inward.
    assert {("-T", "none"), ("-U", "none"), ("-t", "none"), ("-u", "none")} <= pairs
    assert {("--netns", "/proc/self/fd/7"), ("--userns", "/proc/self/fd/5"),
            ("-P", "/proc/self/fd/9")} <= pairs
    assert "-f" in argv and "--config-net" in argv


def test_the_hosts_own_addresses_are_those_not_loopback_nor_link_local() -> None:
    links: list[dict[str, object]] = [
        {"ifname": "lo", "addr_info": [{"local": "127.0.0.1"}, {"local": "::1"}]},
        {"ifname": "eth0", "addr_info": [{"local": "192.0.2.2"}, {"local": "fd00::2"},
                                         {"local": "fe80::1"}, {"local": "192.0.2.2"}]},
        {"ifname": "odd", "addr_info": [{"nolocal": 1}, {"local": "not an address"}]},
        {"ifname": "none"},
    ]
    assert usernet.addresses_of(links) == ("192.0.2.2", "fd00::2")


def test_a_pasta_workspaces_state_is_kept() -> None:
    state = network.State(pasta=(1234, 56.5))
    assert network.State.loads(state.dumps()) == state
    assert network.State.loads('{"link": 3, "guard": null}') == network.State(link=3)


def test_pastas_rules_refuse_the_hosts_own_addresses_and_cap_connections() -> None:
    rules = network.Rules(policy=E, link=None, fleet=("127.0.0.1", "192.0.2.2", "fd00::2"),
                          resolvers=("10.255.255.53",), max_connections=7)
    text = network.ruleset(rules, replace=False)
    fleet4 = text.split("set fleet4 {")[1].split("}")[0]
    assert "192.0.2.2" in fleet4 and "fd00::2" in text.split("set fleet6 {")[1].split("}")[0]
    assert "ct count over 7" in text
    assert "dnat ip to 10.255.255.53:53" in text
    with pytest.raises(ValueError, match="link"):
        network.ruleset(network.Rules(policy=A, link=None))


NO_PASTA = NetworkRules(host_ok=True, problem="pasta is not installed")
NO_ALLOW = NetworkRules(allow_problem="`allow` needs a root worker")

# (rules, asked network) -> the policy granted, or the error kind
GRANTS: list[tuple[NetworkRules, NetworkPolicy | None, NetworkPolicy | str]] = [
    # Where egress cannot be given, the default is none: never the host's namespace,
    # even where the operator lets workspaces ask for it.
    (NO_PASTA, None, N),
    (NO_PASTA, H, H),
    (NO_PASTA, E, "unavailable"),
    (NO_PASTA, A, "unavailable"),
    # A worker that is not root gives egress, not allow.
    (NO_ALLOW, None, E),
    (NO_ALLOW, E, E),
    (NO_ALLOW, A, "unavailable"),
    (NO_ALLOW, H, "invalid"),
]


@pytest.mark.parametrize(("rules", "asked", "expected"), GRANTS)
def test_what_a_host_grants(rules: NetworkRules, asked: NetworkPolicy | None,
                            expected: NetworkPolicy | str) -> None:
    def decision() -> Choice:
        return sandbox.decide(configured="auto", available=True, reason=None, asked=None,
                              network=asked, host_network=False, rules=rules)

    if isinstance(expected, NetworkPolicy):
        assert decision() == Choice("process", expected)
        return
    with pytest.raises(IsolationError) as caught:
        decision()
    assert caught.value.kind == expected
