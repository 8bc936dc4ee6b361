"""OpenTelemetry traces of the turn path and of advisory prefetches, behind one seam that is free when off.

Operators ask where a turn spent its time and which advisory foresaw it; a trace per turn answers both. Tracing is
off unless the standard `OTEL_*` variables configure an OTLP exporter (`tracing_from_environ`): then the SDK's own
readers take the rest (`OTEL_EXPORTER_OTLP_*` endpoint, headers and timeout, `OTEL_SERVICE_NAME`,
`OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`), and spans go over OTLP/HTTP (protobuf) from the batch processor's thread.
Off, the gateway holds `NO_TRACING`, whose turns are `NO_TURN`: every call on the hot path is an empty method,
and the chat path checks `TurnTrace.recording` before any work a trace alone needs (routing scores, log ids).
The SDK is imported only when tracing is on, so a gateway without the `tracing` extra runs as before.

A turn is one trace (`sessiongate.turn`, the child of the client's W3C `traceparent` when it sends one) with
spans for admission, the store's begin and end of the turn, routing (the chosen worker and the scores of the
workers it beat) and each upstream request (its `traceparent` header is what the worker receives). An advisory's
prefetch is its own trace (`sessiongate.prefetch`: bytes loaded, pages by tier); the turn that claims the
advisory links to it. Spans use the gateway's own `TracerProvider`, never the process-global one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = ["NO_PREFETCH", "NO_TRACING", "NO_TURN", "PrefetchTrace", "Tracing", "TurnTrace", "tracing_from_environ"]

log = structlog.get_logger(__name__)

_NULL = contextlib.nullcontext()


class TurnTrace:
    """One turn's trace; this base is the no-op one (tracing off, or the turn not sampled)."""

    recording = False

    def span(self, name: str) -> contextlib.AbstractContextManager[object]:
        """A child span of the turn around a step (admission, the store's begin and end of the turn)."""
        return _NULL

    def routed(self, span: object, worker_id: str, policy: str, scores: Mapping[str, float]) -> None:
        """The routing decision, on the route's `span`: the chosen worker and the scores of those it beat."""

    def identify(self, session_id: str, turn_id: str) -> None:
        """The turn's ids, once the store has given it one."""

    def link_advisory(self, context: object | None) -> None:
        """Link the turn to the trace of the advisory prefetch that foresaw it (`PrefetchTrace.context`)."""

    def upstream_start(self, worker_id: str) -> str | None:
        """Open the span of one upstream request; the `traceparent` header it is to carry (None: none)."""
        return None

    def first_token(self) -> None:
        """The upstream answer's first token arrived (streamed turns)."""

    def upstream_end(self, *, usage: Mapping[str, Any] | None = None, error: BaseException | None = None) -> None:
        """Close the open upstream span (no-op when there is none)."""

    def end(
        self,
        status: str,
        *,
        error: BaseException | None = None,
        cached_tokens: Mapping[str, Any] | None = None,
    ) -> None:
        """End the turn's trace; only the first call counts (a turn may be ended on two paths)."""


class PrefetchTrace:
    """One advisory prefetch's span; this base is the no-op one."""

    context: object | None = None

    def done(self, *, target: str, bytes_loaded: int | None, pages: Mapping[str, int]) -> None:
        """What the prefetch brought: its target tier, bytes loaded, pages by tier."""

    def failed(self, state: str) -> None:
        """The prefetch ended otherwise than done."""


NO_TURN = TurnTrace()
NO_PREFETCH = PrefetchTrace()


class Tracing:
    """The gateway's tracer; this base is tracing off."""

    enabled = False

    def turn(self, traceparent: str | None) -> TurnTrace:
        return NO_TURN

    @contextlib.contextmanager
    def prefetch(self, *, advisory_id: str, session_id: str, kind: str, worker_id: str) -> Iterator[PrefetchTrace]:
        yield NO_PREFETCH

    def shutdown(self) -> None:
        """Send what is left and stop (the lifespan's end)."""


NO_TRACING = Tracing()


def tracing_from_environ(environ: Mapping[str, str]) -> Tracing:
    """The tracing the standard `OTEL_*` variables ask for: on with an OTLP exporter when `OTEL_TRACES_EXPORTER`
    names `otlp`, or when it is unset and an OTLP endpoint is set; off otherwise, and with `OTEL_SDK_DISABLED`."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return NO_TRACING
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if "otlp" not in exporters and (exporters or not endpoint):
        if exporters - {"none"}:
            log.warning("tracing_exporter_unsupported", exporters=sorted(exporters), supported="otlp")
        return NO_TRACING
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "http/protobuf":
        log.warning("tracing_protocol_unsupported", protocol=protocol, used="http/protobuf")
    try:
        return OtelTracing.start(service_name="sessiongate-gateway")
    except ImportError as exc:
        log.error("tracing_unavailable", error=str(exc), detail="install sessiongate[tracing]")
        return NO_TRACING


class OtelTracing(Tracing):
    """Tracing on: the OpenTelemetry SDK with a batch processor and the OTLP/HTTP exporter."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("sessiongate.gateway")
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def start(cls, *, service_name: str) -> OtelTracing:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default name.
        resource = Resource({"service.name": service_name}).merge(OTELResourceDetector().detect())
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("tracing_on", exporter="otlp", protocol="http/protobuf")
        return cls(provider)

    def turn(self, traceparent: str | None) -> TurnTrace:
        from opentelemetry.trace import SpanKind

        parent = self.propagator.extract({"traceparent": traceparent}) if traceparent else None
        span = self.tracer.start_span("sessiongate.turn", context=parent, kind=SpanKind.SERVER)
        if not span.is_recording():
            span.end()
            return NO_TURN
        return _OtelTurn(self, span)

    @contextlib.contextmanager
    def prefetch(self, *, advisory_id: str, session_id: str, kind: str, worker_id: str) -> Iterator[PrefetchTrace]:
        from opentelemetry.trace import StatusCode

        attributes = {
            "sessiongate.advisory.id": advisory_id,
            "sessiongate.advisory.kind": kind,
            "sessiongate.session_id": session_id,
            "sessiongate.worker": worker_id,
        }
        span = self.tracer.start_span("sessiongate.prefetch", context=_root(), attributes=attributes)
        try:
            yield _OtelPrefetch(span)
        except BaseException as exc:
            span.set_status(StatusCode.ERROR, type(exc).__name__)
            raise
        finally:
            span.end()

    def shutdown(self) -> None:
        self.provider.shutdown()


def _root() -> Any:
    """An empty context: a prefetch starts its own trace, whatever the task that fired it inherited."""
    from opentelemetry.context import Context

    return Context()


class _OtelTurn(TurnTrace):
    recording = True

    def __init__(self, tracing: OtelTracing, span: Span) -> None:
        from opentelemetry.trace import set_span_in_context

        self.tracing = tracing
        self.root = span
        self.context = set_span_in_context(span)
        self.upstream: Span | None = None
        self.upstream_started = 0.0
        self.first_byte = False
        self.ended = False
        ids = span.get_span_context()
        structlog.contextvars.bind_contextvars(trace_id=f"{ids.trace_id:032x}", span_id=f"{ids.span_id:016x}")

    @contextlib.contextmanager
    def _child(self, name: str) -> Iterator[object]:
        # Not made the current span (no contextvar to set and reset): the turn's spans are parented explicitly.
        span = self.tracing.tracer.start_span(name, context=self.context)
        try:
            yield span
        except BaseException as exc:
            _fail(span, exc)
            raise
        finally:
            span.end()

    def span(self, name: str) -> contextlib.AbstractContextManager[object]:
        return self._child(name)

    def routed(self, span: object, worker_id: str, policy: str, scores: Mapping[str, float]) -> None:
        from opentelemetry.trace import Span

        if not isinstance(span, Span):
            return
        chosen = scores.get(worker_id)
        attributes: dict[str, Any] = {"sessiongate.worker": worker_id, "sessiongate.route.policy": policy}
        if chosen is not None:
            attributes["sessiongate.route.score"] = chosen
        beaten = sorted((w, s) for w, s in scores.items() if w != worker_id)
        attributes["sessiongate.route.beaten"] = [w for w, _ in beaten]
        attributes["sessiongate.route.beaten_scores"] = [s for _, s in beaten]
        span.set_attributes(attributes)
        self.root.set_attribute("sessiongate.worker", worker_id)

    def identify(self, session_id: str, turn_id: str) -> None:
        self.root.set_attributes({"sessiongate.session_id": session_id, "sessiongate.turn_id": turn_id})

    def link_advisory(self, context: object | None) -> None:
        from opentelemetry.trace import SpanContext

        if isinstance(context, SpanContext):
            self.root.add_link(context, {"sessiongate.link": "advisory_prefetch"})
            self.root.set_attribute("sessiongate.advisory.trace_id", f"{context.trace_id:032x}")

    def upstream_start(self, worker_id: str) -> str | None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        self.upstream = span = self.tracing.tracer.start_span(
            "sessiongate.upstream",
            context=self.context,
            kind=SpanKind.CLIENT,
            attributes={"sessiongate.worker": worker_id},
        )
        self.upstream_started = time.perf_counter()
        self.first_byte = False
        self.root.set_attribute("sessiongate.worker", worker_id)
        carrier: dict[str, str] = {}
        self.tracing.propagator.inject(carrier, context=set_span_in_context(span))
        return carrier.get("traceparent")

    def first_token(self) -> None:
        if self.upstream is not None:
            self.first_byte = True
            self.upstream.set_attribute(
                "sessiongate.time_to_first_byte_ms", (time.perf_counter() - self.upstream_started) * 1000
            )

    def upstream_end(self, *, usage: Mapping[str, Any] | None = None, error: BaseException | None = None) -> None:
        span, self.upstream = self.upstream, None
        if span is None:
            return
        if usage:
            span.set_attributes({f"gen_ai.usage.{k}": v for k, v in _token_counts(usage).items()})
        if error is not None:
            _fail(span, error)
        elif not self.first_byte:
            # A non-streamed answer arrives whole: its first byte is its last.
            span.set_attribute(
                "sessiongate.time_to_first_byte_ms", (time.perf_counter() - self.upstream_started) * 1000
            )
        span.end()

    def end(
        self,
        status: str,
        *,
        error: BaseException | None = None,
        cached_tokens: Mapping[str, Any] | None = None,
    ) -> None:
        if self.ended:
            return
        self.ended = True
        self.upstream_end(error=error)
        self.root.set_attribute("sessiongate.turn.status", status)
        for tier in ("device", "host", "storage"):
            value = (cached_tokens or {}).get(tier)
            if isinstance(value, int):
                self.root.set_attribute(f"sessiongate.cached_tokens.{tier}", value)
        if error is not None:
            _fail(self.root, error)
        self.root.end()


def _token_counts(usage: Mapping[str, Any]) -> dict[str, int]:
    """The usage's token counts under OpenTelemetry's GenAI names (`gen_ai.usage.input_tokens`, ...)."""
    names = {"prompt_tokens": "input_tokens", "completion_tokens": "output_tokens"}
    return {names[k]: v for k, v in usage.items() if k in names and isinstance(v, int)}


def _fail(span: Span, error: BaseException) -> None:
    from opentelemetry.trace import StatusCode

    message = getattr(error, "message", None) or type(error).__name__
    span.set_status(StatusCode.ERROR, str(message))
    span.set_attribute("error.type", type(error).__name__)


class _OtelPrefetch(PrefetchTrace):
    def __init__(self, span: Span) -> None:
        self.span = span
        self.context = span.get_span_context()

    def done(self, *, target: str, bytes_loaded: int | None, pages: Mapping[str, int]) -> None:
        attributes: dict[str, Any] = {f"sessiongate.prefetch.pages.{tier}": n for tier, n in pages.items()}
        attributes["sessiongate.prefetch.state"] = "done"
        attributes["sessiongate.prefetch.target"] = target
        if bytes_loaded is not None:
            attributes["sessiongate.prefetch.bytes"] = bytes_loaded
        self.span.set_attributes(attributes)

    def failed(self, state: str) -> None:
        from opentelemetry.trace import StatusCode

        self.span.set_attribute("sessiongate.prefetch.state", state)
        self.span.set_status(StatusCode.ERROR, state)
