"""Which Ray a run uses, by ``ray.init()``'s own convention, and a one-second check of a cluster before joining it.

``engine.address``:

- ``null`` (the default) does what ``ray.init()`` with no address does: join the cluster named by ``RAY_ADDRESS``,
  else the one ``ray start`` recorded in ``<ray temp dir>/ray_current_cluster`` (``/tmp/ray`` unless
  ``RAY_TMPDIR``), else start a private local Ray. Unlike ``ray.init()``, a recorded cluster that no longer answers
  (its head ended without ``ray stop``, leaving the file behind) is passed over: a private local Ray starts.
- ``local``: always a private local Ray (``ray.init(address="local")``), whatever runs on the machine.
- ``auto``: join the running cluster (``RAY_ADDRESS``, else the recorded one), or stop with an error.
- ``host:port`` or ``ray://host:port``: that cluster.

Before ``ray.init`` joins a ``host:port`` cluster, one gRPC call to its GCS (the call ``ray.init`` starts with)
tells a live cluster from a gone one and a refused token from either; ``ray.init`` itself retries for ~20 s, logging
a warning a second, and then raises a ``ConnectionError`` that hides the cause.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from raysim.errors import UserError

PROBE_TIMEOUT_S = 5.0


def recorded_cluster_file() -> Path:
    """Where ``ray start`` records the address of the cluster it started (Ray removes it on ``ray stop``)."""
    from ray._common.utils import get_ray_address_file

    return Path(get_ray_address_file(None))


def _recorded_address() -> Optional[str]:
    try:
        text = recorded_cluster_file().read_text().strip()
    except OSError:
        return None
    return text or None


def probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[str, str]:
    """("ok" | "unauthenticated" | "unreachable", detail): one ``GetClusterId`` call to the GCS at ``host:port``,
    with the token ``ray.init`` would send (Ray's own channel and interceptor)."""
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = init_grpc_channel(address, asynchronous=False)
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(gcs_service_pb2.GetClusterIdRequest(),
                                                                          timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code()
        detail = (exc.details() or str(code)).splitlines()[0].rsplit(": ", 1)[-1]  # "Connection refused"
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return "unauthenticated", detail
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return "unreachable", detail
        return "ok", detail  # any other answer comes from a live GCS: ray.init decides
    finally:
        channel.close()
    return "ok", ""


def _auto_token() -> None:
    """What ``ray.init`` does for an address it found itself (none given, or "auto"): use token authentication when
    a token exists here (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``) and RAY_AUTH_MODE is
    unset. An address given explicitly (argument or ``RAY_ADDRESS``) never sends the token unless
    RAY_AUTH_MODE=token."""
    import logging

    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available

    # its notice that token authentication is on is silenced, as for the local Ray raysim starts
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def auth_error(address: str, key: str) -> UserError:
    """The one line for a cluster that refused this process's token (or its lack of one)."""
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    if is_token_auth_enabled():
        return UserError(f"{key}: the Ray cluster at {address} refused this process's authentication token; use "
                         f"the cluster's token (`ray get-auth-token` on its head prints it) in ~/.ray/auth_token, "
                         f"RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
    return UserError(f"{key}: the Ray cluster at {address} requires token authentication and this process sent no "
                     f"token; set RAY_AUTH_MODE=token, with the cluster's token (`ray get-auth-token` on its head "
                     f"prints it) in ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")


def _check(address: str, key: str) -> None:
    """Raise a one-line UserError unless the cluster at ``address`` answers and accepts this process."""
    if "://" in address:  # Ray Client (ray://): its own protocol, checked by ray.init
        return
    state, detail = probe(address)
    if state == "unauthenticated":
        raise auth_error(address, key)
    if state == "unreachable":
        raise UserError(f"{key}: cannot reach a Ray cluster at {address!r} ({detail}); start one with "
                        f"`ray start --head` or use engine.address=null")


def choose_cluster(address: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """(the address for ``ray.init``, or None to start a private local Ray; a notice for the user, or None)."""
    if address == "local":
        return None, None
    env = os.environ.get("RAY_ADDRESS") or None
    if address not in (None, "auto"):
        _check(address, "config key 'engine.address'")
        return address, None
    if env == "local":
        return None, None
    if env is not None and env != "auto":  # ray.init's first rule, for null and "auto" alike
        _check(env, "environment variable RAY_ADDRESS")
        return env, f"joining the Ray cluster at {env} (RAY_ADDRESS)"
    recorded = _recorded_address()
    if recorded is None:
        return ("auto", None) if address == "auto" else (None, None)  # "auto": ray.init also looks for a local GCS
    _auto_token()
    state, detail = probe(recorded)
    if state == "unauthenticated":
        raise auth_error(recorded, "the Ray cluster started by `ray start`")
    if state == "unreachable":
        if address == "auto":
            raise UserError(f"config key 'engine.address': the Ray cluster recorded in {recorded_cluster_file()} "
                            f"({recorded}) is gone ({detail}); start one with `ray start --head`, or use "
                            f"engine.address=null to start a private one")
        return None, None  # a stale record left by a head that ended without `ray stop`: start a private Ray
    notice = None if address == "auto" else (f"joining the Ray cluster at {recorded} (started by `ray start`); "
                                             f"engine.address=local starts a private one instead")
    return "auto", notice
