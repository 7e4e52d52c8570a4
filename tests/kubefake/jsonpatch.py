"""RFC 6902 JSON patch as kube-apiserver applies it: evanphx/json-patch v4 ``Patch.Apply``, refused as
``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go`` ``applyJSPatch`` refuses (see tests/FIDELITY.md).

Every operation applies to one copy of the object, so a failing one (a ``test`` that does not hold, a path whose
parent is missing) changes nothing. The server answers any such failure alike -- 422 Invalid, a fixed message and
empty details: the library's own words (``testing value ... failed: test failed``) never reach the client.
"""

from __future__ import annotations

import copy
import json
from typing import Any

#: ``maxJSONPatchOperations`` of patch.go.
MAX_OPERATIONS = 10000
#: ``errors.NewGenericServerResponse``'s message for a 422.
REFUSED_MESSAGE = "the server rejected our request due to an error in our request"


class Refusal(Exception):
    """How the API server refuses a JSON patch: ``code``, ``reason``, the message it answers, the details."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


class _Failed(Exception):
    """An operation that does not apply, in evanphx/json-patch's words (kept for the fake's own log only)."""


def apply(target: dict[str, Any], operations: Any) -> dict[str, Any]:
    """``operations`` applied to a copy of ``target``, or :class:`Refusal` as the API server answers."""
    if not isinstance(operations, list):
        raise Refusal(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    if len(operations) > MAX_OPERATIONS:
        raise Refusal(
            413,
            "RequestEntityTooLarge",
            f"Request entity too large: The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, "
            f"got {len(operations)}",
        )
    if not all(isinstance(op, dict) for op in operations):
        raise Refusal(400, "BadRequest", "json: cannot unmarshal into Go value of type jsonpatch.Operation")
    doc = copy.deepcopy(target)
    try:
        for op in operations:
            kind = op.get("op")
            if kind in ("move", "copy"):
                raise NotImplementedError(f"kubefake does not model the JSON patch {kind} operation")
            _APPLY.get(kind, _unexpected)(doc, op)
    except _Failed as exc:
        # NewGenericServerResponse(422, "", GroupResource{}, "", err.Error(), 0, false): no causes, the text dropped
        raise Refusal(422, "Invalid", REFUSED_MESSAGE, {}) from exc
    return doc


def _decode(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")  # RFC 6901, in decodePatchKey's order


def _child(node: Any, key: str) -> Any:
    """``container.get``: an object's member (None when absent) or an array's element."""
    if isinstance(node, dict):
        return node.get(key)
    try:
        return node[_index(key, len(node))]
    except _Failed:
        return None


def _index(key: str, size: int) -> int:
    try:
        index = int(key)
    except ValueError as exc:
        raise _Failed(f"value was not a proper array index: '{key}'") from exc
    if index >= size or index < -size:  # SupportNegativeIndices (v4's default): -1 is the last
        raise _Failed(f"Unable to access invalid index: {index}: invalid index referenced")
    return index % size if index < 0 else index


def _find(doc: Any, path: Any) -> tuple[Any, str] | None:
    """``findObject``: the object or array holding ``path``'s last token, and that token; None when a parent is
    missing (or is no container)."""
    tokens = path.split("/") if isinstance(path, str) else []
    if len(tokens) < 2:
        return None
    node = doc
    for token in tokens[1:-1]:
        node = _child(node, _decode(token))
        if not isinstance(node, dict | list):
            return None
    return node, _decode(tokens[-1])


def _where(doc: Any, op: dict[str, Any], verb: str) -> tuple[Any, str]:
    found = _find(doc, op.get("path"))
    if found is None:
        raise _Failed(f'{verb} operation does not apply: doc is missing path: "{op.get("path")}": missing value')
    return found


def _add(doc: Any, op: dict[str, Any]) -> None:
    node, key = _where(doc, op, "add")
    value = copy.deepcopy(op.get("value"))
    if isinstance(node, dict):
        node[key] = value
    elif key == "-":
        node.append(value)
    else:
        node.insert(_index(key, len(node) + 1), value)


def _remove(doc: Any, op: dict[str, Any]) -> None:
    node, key = _where(doc, op, "remove")
    if isinstance(node, dict):
        if key not in node:
            raise _Failed(f"error in remove for path: '{op['path']}': Unable to remove nonexistent key: {key}")
        del node[key]
    else:
        del node[_index(key, len(node))]


def _replace(doc: Any, op: dict[str, Any]) -> None:
    node, key = _where(doc, op, "replace")
    value = copy.deepcopy(op.get("value"))
    if isinstance(node, dict):
        node[key] = value  # v4's partialDoc.get never fails: an absent member is set, as by an add
    else:
        node[_index(key, len(node))] = value


def _test(doc: Any, op: dict[str, Any]) -> None:
    found = _find(doc, op.get("path"))
    if found is None:
        raise _Failed(f"test operation does not apply: is missing path: {op.get('path')}: missing value")
    actual = _child(*found)
    if actual is None and op.get("value") is None:
        return  # v4: an absent member tests equal to null
    if actual is None or _canonical(actual) != _canonical(op.get("value")):
        raise _Failed(f"testing value {op.get('path')} failed: test failed")


def _canonical(value: Any) -> str:
    """JSON equality as text: 1 is neither true nor 1.0 (the library compares compacted JSON)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _unexpected(doc: Any, op: dict[str, Any]) -> None:
    raise _Failed(f"Unexpected kind: {op.get('op')}")


_APPLY = {"add": _add, "remove": _remove, "replace": _replace, "test": _test}
