"""A Pact Broker in memory: the part of its HAL API the contracts' release flow walks.

The release flow (``make pact-broker``) publishes the consumer pacts
(``contracts/pact-publish.sh``), verifies identity-fanout against the broker's pacts and
publishes the verification results (the pact verifier, through the pact FFI), then asks
``can-i-deploy`` of every pacticipant (``contracts/pact-can-i-deploy.sh``). The real broker
is a Ruby service this workplace cannot install, so the tests run that flow against this
one: the same resources and relations the Pact Broker documents (``POST /contracts/publish``,
``pb:provider-pacts-for-verification``, ``pb:publish-verification-results``,
``pb:provider`` -> ``pb:branch-version``, ``GET /matrix``), the same JSON in and out, and
state enough to answer the matrix from what was really published and verified. Deployments
and environments are not modelled: every latest pact counts, whatever ``environment`` says.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass(frozen=True)
class PublishedPact:
    consumer: str
    provider: str
    consumer_version: str
    branch: str
    content: bytes

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.content).hexdigest()  # noqa: S324 - a content address, as the broker's


@dataclass(frozen=True)
class VerificationResult:
    provider: str
    consumer: str
    pact_sha: str
    provider_version: str
    success: bool
    body: dict[str, Any]


@dataclass
class BrokerState:
    pacts: list[PublishedPact] = field(default_factory=list)
    results: list[VerificationResult] = field(default_factory=list)
    branch_versions: set[tuple[str, str, str]] = field(default_factory=set)
    """(pacticipant, branch, version) put by the verifier before it publishes results."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def latest_pacts(self, provider: str) -> list[PublishedPact]:
        latest: dict[str, PublishedPact] = {}
        for pact in self.pacts:
            if pact.provider == provider:
                latest[pact.consumer] = pact  # publication order: the last one is the latest
        return list(latest.values())

    def latest_result(
        self, pact: PublishedPact, provider_version: str | None
    ) -> VerificationResult | None:
        found = None
        for result in self.results:
            if (
                result.pact_sha == pact.sha
                and result.consumer == pact.consumer
                and (provider_version is None or result.provider_version == provider_version)
            ):
                found = result
        return found

    def matrix(self, pacticipant: str, version: str) -> dict[str, Any]:
        """The matrix's answer for one pacticipant version, as ``latestby=cvp`` reads it."""
        rows: list[tuple[str, VerificationResult | None]] = []
        as_consumer = [
            p for p in self.pacts if p.consumer == pacticipant and p.consumer_version == version
        ]
        for pact in as_consumer:
            rows.append(
                (f"{pact.consumer} {version} -> {pact.provider}", self.latest_result(pact, None))
            )
        providers = {p.provider for p in self.pacts}
        if pacticipant in providers:
            for pact in self.latest_pacts(pacticipant):
                rows.append(
                    (
                        f"{pact.consumer} {pact.consumer_version} -> {pacticipant} {version}",
                        self.latest_result(pact, version),
                    )
                )
        known = as_consumer or pacticipant in providers
        success = sum(1 for _, r in rows if r is not None and r.success)
        failed = sum(1 for _, r in rows if r is not None and not r.success)
        unknown = sum(1 for _, r in rows if r is None)
        deployable = bool(known) and failed == 0 and unknown == 0
        if not known:
            reason = f"No pacts or verifications have been published for {pacticipant} {version}"
        elif deployable:
            reason = "All required verification results are published and successful"
        else:
            reason = "; ".join(
                f"{pair}: {'missing verification' if r is None else 'verification failed'}"
                for pair, r in rows
                if r is None or not r.success
            )
        return {
            "summary": {
                "deployable": deployable,
                "reason": reason,
                "success": success,
                "failed": failed,
                "unknown": unknown,
            },
            "matrix": [
                {"pair": pair, "success": None if r is None else r.success} for pair, r in rows
            ],
        }


class _Handler(BaseHTTPRequestHandler):
    server: _BrokerServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read the broker's state, not its access log."""

    # -- plumbing -------------------------------------------------------------------------

    @property
    def base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _reply(self, body: dict[str, Any], status: HTTPStatus = HTTPStatus.OK) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/hal+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        loaded: dict[str, Any] = json.loads(raw or b"{}")
        return loaded

    def _authorised(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        if self.headers.get("Authorization") == f"Bearer {token}":
            return True
        self._reply({"error": "authentication required"}, HTTPStatus.UNAUTHORIZED)
        return False

    def _route(self, method: str) -> None:
        path = unquote(urlsplit(self.path).path).rstrip("/") or "/"
        if not self._authorised():
            return
        for verb, pattern, resource in ROUTES:
            match = re.fullmatch(pattern, path)
            if verb == method and match is not None:
                getattr(self, resource)(**match.groupdict())
                return
        self._reply({"error": f"no resource {method} {path}"}, HTTPStatus.NOT_FOUND)

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    # -- resources ------------------------------------------------------------------------

    def _index(self) -> None:
        self._reply(
            {
                "_links": {
                    "pb:publish-contracts": {"href": f"{self.base}/contracts/publish"},
                    "pb:provider-pacts-for-verification": {
                        "href": f"{self.base}/pacts/provider/{{provider}}/for-verification",
                        "templated": True,
                    },
                }
            }
        )

    def _publish(self) -> None:
        body = self._body()
        state = self.server.state
        published = []
        for contract in body["contracts"]:
            pact = PublishedPact(
                consumer=contract["consumerName"],
                provider=contract["providerName"],
                consumer_version=body["pacticipantVersionNumber"],
                branch=body.get("branch", ""),
                content=base64.b64decode(contract["content"]),
            )
            published.append(pact)
        with state.lock:
            state.pacts.extend(published)
        self._reply({"logs": [{"level": "info", "message": f"{len(published)} pacts published"}]})

    def _for_verification_link(self, provider: str) -> None:
        href = f"{self.base}/pacts/provider/{provider}/for-verification"
        self._reply({"_links": {"self": {"href": href}}})

    def _for_verification(self, provider: str) -> None:
        self_link = {"href": f"{self.base}/pacts/provider/{provider}/for-verification"}
        self._body()  # the selectors: every latest pact is selected here
        pacts = self.server.state.latest_pacts(provider)
        self._reply(
            {
                "_embedded": {
                    "pacts": [
                        {
                            "shortDescription": f"latest pact of {p.consumer}",
                            "verificationProperties": {"pending": False, "notices": []},
                            "_links": {"self": {"href": self._pact_href(p), "name": p.consumer}},
                        }
                        for p in pacts
                    ]
                },
                "_links": {"self": self_link},
            }
        )

    def _pact_href(self, pact: PublishedPact) -> str:
        return (
            f"{self.base}/pacts/provider/{pact.provider}/consumer/{pact.consumer}"
            f"/pact-version/{pact.sha}"
        )

    def _pact(self, *, provider: str, consumer: str, sha: str) -> None:
        for pact in self.server.state.pacts:
            if (pact.provider, pact.consumer, pact.sha) == (provider, consumer, sha):
                content = json.loads(pact.content)
                href = self._pact_href(pact)
                content["_links"] = {
                    "self": {"href": href},
                    "pb:provider": {"href": f"{self.base}/pacticipants/{provider}"},
                    "pb:publish-verification-results": {"href": f"{href}/verification-results"},
                }
                self._reply(content)
                return
        self._reply({"error": "no such pact"}, HTTPStatus.NOT_FOUND)

    def _verification(self, *, provider: str, consumer: str, sha: str) -> None:
        body = self._body()
        result = VerificationResult(
            provider=provider,
            consumer=consumer,
            pact_sha=sha,
            provider_version=body["providerApplicationVersion"],
            success=bool(body["success"]),
            body=body,
        )
        with self.server.state.lock:
            self.server.state.results.append(result)
        self._reply({"success": result.success}, HTTPStatus.CREATED)

    def _pacticipant(self, name: str) -> None:
        self._reply(
            {
                "name": name,
                "_links": {
                    "pb:branch-version": {
                        "href": f"{self.base}/pacticipants/{name}"
                        "/branches/{branch}/versions/{version}",
                        "templated": True,
                    }
                },
            }
        )

    def _branch_version(self, name: str, branch: str, version: str) -> None:
        with self.server.state.lock:
            self.server.state.branch_versions.add((name, branch, version))
        self._reply({"name": version})

    def _matrix(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        pacticipants, versions = query.get("q[][pacticipant]", []), query.get("q[][version]", [])
        if len(pacticipants) != 1 or len(versions) != 1:
            self._reply({"errors": ["one pacticipant and one version"]}, HTTPStatus.BAD_REQUEST)
            return
        with self.server.state.lock:
            answer = self.server.state.matrix(pacticipants[0], versions[0])
        self._reply(answer)


_NAME = r"[^/]+"
ROUTES: tuple[tuple[str, str, str], ...] = (
    ("GET", "/", "_index"),
    ("POST", "/contracts/publish", "_publish"),
    ("GET", rf"/pacts/provider/(?P<provider>{_NAME})/for-verification", "_for_verification_link"),
    ("POST", rf"/pacts/provider/(?P<provider>{_NAME})/for-verification", "_for_verification"),
    (
        "GET",
        rf"/pacts/provider/(?P<provider>{_NAME})/consumer/(?P<consumer>{_NAME})"
        rf"/pact-version/(?P<sha>{_NAME})",
        "_pact",
    ),
    (
        "POST",
        rf"/pacts/provider/(?P<provider>{_NAME})/consumer/(?P<consumer>{_NAME})"
        rf"/pact-version/(?P<sha>{_NAME})/verification-results",
        "_verification",
    ),
    ("GET", rf"/pacticipants/(?P<name>{_NAME})", "_pacticipant"),
    (
        "PUT",
        rf"/pacticipants/(?P<name>{_NAME})/branches/(?P<branch>{_NAME})"
        rf"/versions/(?P<version>{_NAME})",
        "_branch_version",
    ),
    ("GET", "/matrix", "_matrix"),
)
"""(method, path pattern, resource method): the broker's resources this one serves."""


class _BrokerServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: BrokerState, token: str | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        self.token = token


@dataclass(frozen=True)
class LocalPactBroker:
    url: str
    state: BrokerState
    token: str | None


@contextmanager
def local_pact_broker(token: str | None = None) -> Iterator[LocalPactBroker]:
    """A broker on a free local port for the block; ``token``: bearer auth required."""
    state = BrokerState()
    server = _BrokerServer(state, token)
    thread = threading.Thread(target=server.serve_forever, name="pact-broker", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield LocalPactBroker(url=f"http://{host!s}:{port}", state=state, token=token)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
