"""JSON-RPC 2.0 messages read from a parsed body: one message or a batch. No I/O.

Each member of a body becomes an `RpcMessage` (a request, a notification or a response),
numbered by its place in the batch. Refused, so that the gateway and the server cannot
disagree about which message is which:

- a member that is not an object, `jsonrpc` other than "2.0", a method that is not a
  string, a request that is also a response;
- an id that is not a string, an integer or null (a float or a bool id has no one reading);
- ids that collide within one batch: an answer is matched to its call by id, and a batch
  that says `1` twice (or `1` and `"1"`, which some servers merge) could make a denial land
  on the allowed call;
- `params` that is neither an object nor an array (`params` as an array is legal JSON-RPC,
  kept as is: the protocol on top says whether its method takes one);
- an empty batch, and a batch over `max_batch` members.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NoReturn

from sandgate.policy.protocols.errors import JsonRpcError, Problem
from sandgate.policy.protocols.json_strict import DEFAULT_LIMITS, JsonLimits, JsonValue, loads_strict

__all__ = [
    "DEFAULT_MAX_BATCH",
    "Kind",
    "RpcBody",
    "RpcMessage",
    "parse_jsonrpc",
    "read_jsonrpc",
]

DEFAULT_MAX_BATCH = 64

type RpcId = str | int | None
type Params = dict[str, JsonValue] | list[JsonValue] | None


class Kind(StrEnum):
    """What a JSON-RPC message is."""

    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"


@dataclass(frozen=True, slots=True)
class RpcMessage:
    """One JSON-RPC message. `id` keeps its JSON type (str, int or None for null); a
    notification has no id at all (`has_id` False). `index` is its place in a batch, None
    for a body that is one message."""

    kind: Kind
    id: RpcId = None
    has_id: bool = False
    method: str | None = None
    params: Params = None
    index: int | None = None
    # Responses: exactly one of them is set.
    result: JsonValue = None
    error: dict[str, JsonValue] | None = None


@dataclass(frozen=True, slots=True)
class RpcBody:
    """The messages of one body, in order; `batch` when the body was an array."""

    messages: tuple[RpcMessage, ...]
    batch: bool


def parse_jsonrpc(
    data: bytes | str, limits: JsonLimits = DEFAULT_LIMITS, *, max_batch: int = DEFAULT_MAX_BATCH
) -> RpcBody:
    """Strict JSON, then JSON-RPC: the messages of a body (JsonError or JsonRpcError)."""
    return read_jsonrpc(loads_strict(data, limits), max_batch=max_batch)


def read_jsonrpc(value: JsonValue, *, max_batch: int = DEFAULT_MAX_BATCH) -> RpcBody:
    """The JSON-RPC messages of a parsed body, or JsonRpcError naming the first problem."""
    if isinstance(value, dict):
        return RpcBody((read_message(value, None),), batch=False)
    if not isinstance(value, list):
        _fail(Problem.NOT_JSONRPC, "a JSON-RPC body is an object or an array of objects")
    if not value:
        _fail(Problem.EMPTY_BATCH, "an empty batch")
    if len(value) > max_batch:
        _fail(Problem.BATCH_TOO_LARGE, f"{len(value)} messages in one batch, the limit is {max_batch}")
    messages = []
    for index, member in enumerate(value):
        if not isinstance(member, dict):
            _fail(Problem.NOT_JSONRPC, f"batch member {index} is not an object")
        messages.append(read_message(member, index))
    _refuse_colliding_ids(messages)
    return RpcBody(tuple(messages), batch=True)


def read_message(member: dict[str, JsonValue], index: int | None) -> RpcMessage:
    """One JSON-RPC object as a message, or JsonRpcError."""
    if member.get("jsonrpc") != "2.0":
        _fail(Problem.BAD_VERSION, f"{_where(index)}: 'jsonrpc' must be \"2.0\"")
    has_id = "id" in member
    rpc_id = _read_id(member.get("id"), index)
    if "method" in member:
        return _read_call(member, index, rpc_id, has_id)
    if not has_id:
        _fail(Problem.NOT_JSONRPC, f"{_where(index)}: neither a request nor a response")
    if ("result" in member) == ("error" in member):
        _fail(Problem.NOT_JSONRPC, f"{_where(index)}: a response has one of 'result' and 'error'")
    error = member.get("error")
    if "error" in member and not isinstance(error, dict):
        _fail(Problem.NOT_JSONRPC, f"{_where(index)}: 'error' is not an object")
    return RpcMessage(
        Kind.RESPONSE,
        id=rpc_id,
        has_id=True,
        index=index,
        result=member.get("result"),
        error=error if isinstance(error, dict) else None,
    )


def _read_call(member: dict[str, JsonValue], index: int | None, rpc_id: RpcId, has_id: bool) -> RpcMessage:
    """A request (with an id) or a notification (without)."""
    method = member["method"]
    if not isinstance(method, str):
        _fail(Problem.BAD_METHOD, f"{_where(index)}: 'method' is not a string")
    if "result" in member or "error" in member:
        _fail(Problem.NOT_JSONRPC, f"{_where(index)}: a request cannot carry 'result' or 'error'")
    raw = member.get("params")
    if "params" in member and not isinstance(raw, dict | list):
        _fail(Problem.BAD_PARAMS, f"{_where(index)}: 'params' is neither an object nor an array")
    params: Params = raw if isinstance(raw, dict | list) else None
    kind = Kind.REQUEST if has_id else Kind.NOTIFICATION
    return RpcMessage(kind, id=rpc_id, has_id=has_id, method=method, params=params, index=index)


def _read_id(value: JsonValue, index: int | None) -> RpcId:
    """A string, integer or null id; refuse floats and bools."""
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    _fail(Problem.BAD_ID, f"{_where(index)}: an id is a string, an integer or null")


def _refuse_colliding_ids(messages: list[RpcMessage]) -> None:
    """Refuse two messages of one batch with the same id (1 and "1" count as the same; a
    request and a response too: fail closed rather than guess whose id space it is)."""
    seen: dict[str | None, int | None] = {}
    for message in messages:
        if not message.has_id:
            continue
        key = _id_key(message.id)
        if key in seen:
            _fail(Problem.DUPLICATE_ID, f"members {seen[key]} and {message.index} have the same id")
        seen[key] = message.index


def _id_key(rpc_id: RpcId) -> str | None:
    return None if rpc_id is None else str(rpc_id)


def _where(index: int | None) -> str:
    return "the message" if index is None else f"batch member {index}"


def _fail(code: Problem, message: str) -> NoReturn:
    raise JsonRpcError(code, message)
