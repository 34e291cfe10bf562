#!/usr/bin/python3
"""Keeps the fake Kubernetes API server honest.

tests/fakes/kube_api_shapes.json names the part of the core/v1 API that podlinkd
(daemon/identity/kube_pods.cc) and the fake (tests/fakes/kube_apiserver.h) depend on.
This script checks that file from both sides:

  --openapi FILE   against the upstream OpenAPI v3 document (kubernetes/kubernetes,
                   api/openapi-spec/v3/api__v1_openapi.json; JSON, or YAML with PyYAML):
                   every operation (path, method, action, parameters with their types,
                   the 200 response's schema) and every schema field (type, $ref,
                   format, map values, array items) named in the shapes file must be
                   there as stated. Prints one line per item and exits 1 listing every
                   mismatch.
  --fake BINARY    against the fake itself (tests/tools/fake_kube_apiserver.cc): makes a
                   throwaway CA and server certificate for IP:127.0.0.1 with openssl,
                   starts the fake with two pods, and checks over TLS (verified against
                   that CA, with the bearer token) the paged list, the get of each pod
                   and of a missing one (404 Status), requests without or with a wrong
                   token (401 Status) and two short watches; every body must match the
                   shapes (fields present where the fake sets them, JSON types, no field
                   the shapes do not know). Prints one line on success, exits 1 listing
                   every mismatch. Bounded at 18 s; always stops the fake and removes the
                   temporary folder.

Exit status: 0 all checks passed, 1 mismatches, 2 could not run (usage, missing
file, openssl or the fake failed to start).
"""

import argparse
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SHAPES = os.path.join(HERE, "kube_api_shapes.json")
SCHEMA_PREFIX = "#/components/schemas/"
DEADLINE_S = 18          # the whole --fake run, under ctest's and the brief's 20 s
SOCKET_TIMEOUT_S = 5     # any single connect or read
WATCH_SECONDS = 1        # timeoutSeconds asked of each watch

POD = "io.k8s.api.core.v1.Pod"
POD_LIST = "io.k8s.api.core.v1.PodList"
STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
WATCH_EVENT = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent"


class CannotRun(Exception):
    """Setup failed: the checks could not be made (exit 2)."""


class OutOfTime(Exception):
    pass


class FakeFailed(Exception):
    """The fake could not be started with the pods it was given (a failure of the fake: exit 1)."""


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise CannotRun(f"cannot read {path}: {e}") from e
    except ValueError as e:
        raise CannotRun(f"{path} is not valid JSON: {e}") from e


def load_document(path):
    """The OpenAPI document: JSON, or YAML when PyYAML is there."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CannotRun(f"cannot read {path}: {e}") from e
    try:
        return json.loads(raw), raw
    except ValueError:
        pass
    try:
        import yaml  # only for a YAML document
    except ImportError as e:
        raise CannotRun(f"{path} is not JSON, and PyYAML is not installed to read it as YAML") from e
    try:
        return yaml.safe_load(raw), raw
    except yaml.YAMLError as e:
        raise CannotRun(f"{path} is neither JSON nor YAML: {e}") from e


# ---------------------------------------------------------------------------
# --openapi: the shapes against the upstream document
# ---------------------------------------------------------------------------

class Document:
    def __init__(self, doc):
        if not isinstance(doc, dict):
            raise CannotRun("the OpenAPI document is not an object")
        self.doc = doc

    def pointer(self, ref):
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return None
        node = self.doc
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def resolve(self, node):
        """Follows a node that is only a $ref (parameters, responses, schemas)."""
        seen = 0
        while isinstance(node, dict) and "$ref" in node and seen < 32:
            target = self.pointer(node["$ref"])
            if target is None:
                return None
            node = target
            seen += 1
        return node

    def schemas(self):
        return (self.doc.get("components") or {}).get("schemas") or {}

    @staticmethod
    def ref_name(node):
        """The schema a property points at: a bare $ref or Kubernetes' allOf: [{$ref}]."""
        if not isinstance(node, dict):
            return None
        ref = node.get("$ref")
        if ref is None:
            all_of = node.get("allOf")
            if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
                ref = all_of[0].get("$ref")
        if isinstance(ref, str) and ref.startswith(SCHEMA_PREFIX):
            return ref[len(SCHEMA_PREFIX):]
        return None


def check_openapi(shapes, doc_path, shapes_name="kube_api_shapes.json"):
    raw_doc, raw = load_document(doc_path)
    doc = Document(raw_doc)
    lines, problems = [], []

    def ok(what):
        lines.append(f"ok        {what}")

    def bad(what):
        lines.append(f"MISMATCH  {what}")
        problems.append(what)

    info = raw_doc.get("info") or {}
    lines.append(f"document  {doc_path}: openapi {raw_doc.get('openapi')}, {info.get('title')} "
                 f"{info.get('version')}, {len(raw)} bytes, sha256 {hashlib.sha256(raw).hexdigest()}")
    chk = shapes.get("checked_against") or {}
    lines.append(f"shapes    checked_against {chk.get('repo')}@{chk.get('commit')} {chk.get('path')}")
    paths = doc.doc.get("paths") or {}
    schemas = doc.schemas()

    def operation(path, method, label):
        item = doc.resolve(paths.get(path))
        if not isinstance(item, dict):
            bad(f"{label}: no path {path}")
            return None, None
        op = item.get(method.lower())
        if not isinstance(op, dict):
            bad(f"{label}: {path} has no {method} operation")
            return None, None
        return item, op

    def response_schema(op, status, media_type):
        resp = doc.resolve((op.get("responses") or {}).get(str(status)))
        if not isinstance(resp, dict):
            return None, f"no {status} response"
        content = resp.get("content") or {}
        if media_type not in content:
            return None, f"the {status} response has no {media_type} (it has {', '.join(sorted(content)) or 'none'})"
        name = doc.ref_name((content[media_type] or {}).get("schema"))
        if name is None:
            return None, f"the {status} response's {media_type} schema is not a $ref to a component schema"
        return name, None

    for label, want in (shapes.get("operations") or {}).items():
        method, path = want["method"], want["path"]
        item, op = operation(path, method, f"operation {label}")
        if op is None:
            continue
        what = f"operation {label}: {method} {path}"
        ok(f"{what} exists ({op.get('operationId')})")
        action = op.get("x-kubernetes-action")
        if "action" in want:
            if action == want["action"]:
                ok(f"{what}: x-kubernetes-action {action}")
            else:
                bad(f"{what}: x-kubernetes-action is {action!r}, the shapes say {want['action']!r}")
        # Parameters may sit on the path item or on the operation (which wins), inline or by $ref.
        params = {}
        for where in (item.get("parameters") or [], op.get("parameters") or []):
            for p in where:
                p = doc.resolve(p)
                if isinstance(p, dict) and "name" in p and "in" in p:
                    params[(p["in"], p["name"])] = p
        for kind, wanted in (("query", want.get("query") or {}), ("path", want.get("path_params") or {})):
            for name, typ in wanted.items():
                p = params.get((kind, name))
                if p is None:
                    others = sorted(n for (i, n) in params if i == kind)
                    bad(f"{what}: no {kind} parameter {name!r} (there are: {', '.join(others) or 'none'})")
                    continue
                got = (doc.resolve(p.get("schema")) or {}).get("type")
                if got != typ:
                    bad(f"{what}: {kind} parameter {name!r} is {got!r}, the shapes say {typ!r}")
                    continue
                if kind == "path" and (p.get("required") is not True or "{" + name + "}" not in path):
                    bad(f"{what}: path parameter {name!r} is not a required part of the path")
                    continue
                ok(f"{what}: {kind} parameter {name} ({typ})")
        r = want["response"]
        name, err = response_schema(op, r["status"], r["media_type"])
        if err:
            bad(f"{what}: {err}")
        elif name != r["schema"]:
            bad(f"{what}: {r['status']} {r['media_type']} is {name}, the shapes say {r['schema']}")
        else:
            ok(f"{what}: {r['status']} {r['media_type']} -> {name}")
        el = want.get("stream_element")
        if el:
            at = el["documented_at"]
            _, wop = operation(at, "GET", f"operation {label} (stream element)")
            if wop is not None:
                if wop.get("x-kubernetes-action") != el.get("documented_action", wop.get("x-kubernetes-action")):
                    bad(f"{what}: GET {at} is x-kubernetes-action {wop.get('x-kubernetes-action')!r}, "
                        f"the shapes say {el['documented_action']!r}")
                name, err = response_schema(wop, "200", el["media_type"])
                if err:
                    bad(f"{what}: stream element at GET {at}: {err}")
                elif name != el["schema"]:
                    bad(f"{what}: GET {at} streams {name}, the shapes say {el['schema']}")
                else:
                    ok(f"{what}: stream element {name} (as GET {at}, {el['media_type']})")

    errors = shapes.get("errors") or {}
    if errors.get("schema"):
        if errors["schema"] in schemas:
            ok(f"errors: {errors['schema']} exists")
        else:
            bad(f"errors: no schema {errors['schema']}")

    for sname, want in (shapes.get("schemas") or {}).items():
        schema = doc.resolve(schemas.get(sname))
        if not isinstance(schema, dict):
            bad(f"schema {sname}: not in components.schemas")
            continue
        if schema.get("type") != want.get("type", "object"):
            bad(f"schema {sname}: type {schema.get('type')!r}, the shapes say {want.get('type')!r}")
        else:
            ok(f"schema {sname} ({schema.get('type')})")
        gvk = want.get("gvk")
        if gvk:
            listed = schema.get("x-kubernetes-group-version-kind") or []
            if any(all(g.get(k) == v for k, v in gvk.items()) for g in listed if isinstance(g, dict)):
                ok(f"schema {sname}: group-version-kind {gvk['group'] or 'core'}/{gvk['version']} {gvk['kind']}")
            else:
                bad(f"schema {sname}: x-kubernetes-group-version-kind lacks {gvk}")
        required = set(schema.get("required") or [])
        for name in want.get("openapi_required") or []:
            if name in required:
                ok(f"schema {sname}: {name} is required upstream")
            else:
                bad(f"schema {sname}: {name} is not required upstream (required: {sorted(required)})")
        props = schema.get("properties") or {}
        for fname, f in (want.get("fields") or {}).items():
            where = f"{sname}.{fname}"
            if fname not in props:
                bad(f"field {where}: not a property upstream")
                continue
            prop = props[fname]
            ref = doc.ref_name(prop)
            target = doc.resolve(schemas.get(ref)) if ref else None
            if ref and not isinstance(target, dict):
                bad(f"field {where}: refers to {ref}, which is not in components.schemas")
                continue
            node = target if ref else doc.resolve(prop)
            node = node if isinstance(node, dict) else {}
            typ = node.get("type")
            fmt = prop.get("format") or node.get("format")
            found = []
            if typ != f["type"]:
                found.append(f"type {typ!r}, the shapes say {f['type']!r}")
            if "ref" in f and ref != f["ref"]:
                found.append(f"refers to {ref}, the shapes say {f['ref']}")
            if "format" in f and fmt != f["format"]:
                found.append(f"format {fmt!r}, the shapes say {f['format']!r}")
            if "values" in f:
                values = doc.resolve(node.get("additionalProperties"))
                vt = values.get("type") if isinstance(values, dict) else None
                if vt != f["values"]:
                    found.append(f"map values {vt!r}, the shapes say {f['values']!r}")
            if "items_ref" in f:
                it = doc.ref_name(node.get("items"))
                if it != f["items_ref"]:
                    found.append(f"items are {it}, the shapes say {f['items_ref']}")
            if found:
                bad(f"field {where}: " + "; ".join(found))
            else:
                desc = f["type"]
                if "values" in f:
                    desc += f" of {f['values']}"
                if "items_ref" in f:
                    desc += f" of {f['items_ref']}"
                if "ref" in f:
                    desc += f" ({f['ref']})"
                if "format" in f:
                    desc += f", {f['format']}"
                ok(f"field {where}: {desc}")
        for etype, target in (want.get("event_types") or {}).items():
            if target not in (shapes.get("schemas") or {}):
                bad(f"schema {sname}: event {etype} carries {target}, which the shapes do not describe")

    for line in lines:
        print(line)
    checks = sum(1 for line in lines if line.startswith(("ok", "MISMATCH")))
    if problems:
        print(f"FAILED: {len(problems)} of {checks} checks do not match {doc_path}:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"PASSED: all {checks} checks of {shapes_name} match {doc_path}")
    return 0


# ---------------------------------------------------------------------------
# --fake: the fake's answers against the shapes
# ---------------------------------------------------------------------------

JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
INT_RANGE = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}

# The two pods the fake is started with: one scheduled with podlink.io/ annotations, one pending.
PODS = [
    {"uid": "5b1f0c8e-2f1a-4c3e-9d2b-0a1b2c3d4e01", "namespace": "team-a", "name": "trainer-0",
     "node": "node-a", "annotations": {"podlink.io/peer-group": "job-7", "example.com/other": "kept out"}},
    {"uid": "5b1f0c8e-2f1a-4c3e-9d2b-0a1b2c3d4e02", "namespace": "team-b", "name": "pending-0",
     "annotations": {}},
]


def type_ok(value, typ):
    if typ == "integer" and isinstance(value, bool):
        return False
    return isinstance(value, JSON_TYPES.get(typ, (object,)))


def jtype(value):
    for name, kinds in JSON_TYPES.items():
        if type_ok(value, name):
            return name
    return "null" if value is None else type(value).__name__


class FakeCheck:
    def __init__(self, shapes, binary):
        self.shapes = shapes
        self.schemas = shapes.get("schemas") or {}
        self.binary = binary
        self.problems = []
        self.responses = 0
        self.checks = 0
        self.notes = []

    def bad(self, what):
        self.problems.append(what)

    def expect(self, cond, what):
        self.checks += 1
        if not cond:
            self.bad(what)
        return cond

    # -- the shapes as a validator -------------------------------------------------
    def validate(self, obj, sname, where, types_only=False):
        """Checks obj against the shapes' schema sname: JSON types, formats, no field the
        shapes do not know, and every field the fake always sets. Conditional fields
        (scheduled, more_pages) are type-checked here and placed by the callers."""
        spec = self.schemas.get(sname)
        if spec is None:
            self.bad(f"{where}: the shapes do not describe {sname}")
            return
        self.checks += 1
        if not isinstance(obj, dict):
            self.bad(f"{where}: {sname} should be an object, got {jtype(obj)}")
            return
        fields = spec.get("fields") or {}
        for key in obj:
            self.checks += 1
            if key not in fields:
                self.bad(f"{where}.{key}: the fake emits a field kube_api_shapes.json does not list for {sname} "
                         f"(check it upstream and add it, or drop it from the fake)")
        for fname, f in fields.items():
            path = f"{where}.{fname}"
            self.checks += 1
            if fname not in obj:
                if not types_only and f.get("fake") == "always":
                    self.bad(f"{path}: missing ({sname}.{fname} is set by the fake every time, per the shapes)")
                continue
            value = obj[fname]
            if not type_ok(value, f["type"]):
                self.bad(f"{path}: {jtype(value)} {json.dumps(value)[:60]}, the shapes say {f['type']}")
                continue
            fmt = f.get("format")
            if fmt == "date-time" and not RFC3339.match(value):
                self.bad(f"{path}: {value!r} is not an RFC 3339 date-time")
            if fmt in INT_RANGE and not INT_RANGE[fmt][0] <= value <= INT_RANGE[fmt][1]:
                self.bad(f"{path}: {value} is out of {fmt}")
            if "values" in f:
                for k, v in value.items():
                    if not type_ok(v, f["values"]):
                        self.bad(f"{path}[{k!r}]: {jtype(v)}, the shapes say {f['values']}")
            if "items_ref" in f:
                for i, item in enumerate(value):
                    self.validate(item, f["items_ref"], f"{path}[{i}]", types_only)
            if "ref" in f and f["ref"] in self.schemas and f["type"] == "object":
                self.validate(value, f["ref"], path, types_only or f.get("inner") == "types_only")

    def check_pod(self, pod, where, want):
        """A Pod that podlinkd would read, against what the fake was given."""
        self.validate(pod, POD, where)
        if not isinstance(pod, dict):
            return
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        self.expect(pod.get("kind") == "Pod" and pod.get("apiVersion") == "v1",
                    f"{where}: kind/apiVersion {pod.get('kind')!r}/{pod.get('apiVersion')!r}, not Pod/v1")
        self.expect((meta.get("namespace"), meta.get("name")) == (want["namespace"], want["name"]),
                    f"{where}: {meta.get('namespace')}/{meta.get('name')}, not {want['namespace']}/{want['name']}")
        self.expect(isinstance(meta.get("resourceVersion"), str) and meta.get("resourceVersion") != "",
                    f"{where}.metadata.resourceVersion: empty")
        if want.get("node"):
            self.expect(spec.get("nodeName") == want["node"],
                        f"{where}.spec.nodeName: {spec.get('nodeName')!r}, the pod is on {want['node']!r}")
        else:
            self.expect("nodeName" not in spec,
                        f"{where}.spec.nodeName: set ({spec.get('nodeName')!r}) on a pod with no node "
                        f"(the API server omits it until the pod is scheduled)")
        self.expect(meta.get("annotations") == want["annotations"],
                    f"{where}.metadata.annotations: {meta.get('annotations')}, not {want['annotations']}")
        self.expect((pod.get("status") or {}).get("phase") in ("Pending", "Running", "Succeeded", "Failed", "Unknown"),
                    f"{where}.status.phase: {(pod.get('status') or {}).get('phase')!r} is not a pod phase")

    def check_status(self, body, where, code, reason):
        self.validate(body, STATUS, where)
        if not isinstance(body, dict):
            return
        self.expect(body.get("kind") == "Status" and body.get("apiVersion") == "v1",
                    f"{where}: kind/apiVersion {body.get('kind')!r}/{body.get('apiVersion')!r}, not Status/v1")
        self.expect(body.get("code") == code, f"{where}.code: {body.get('code')!r}, the HTTP status is {code}")
        self.expect(body.get("reason") == reason, f"{where}.reason: {body.get('reason')!r}, not {reason!r}")
        self.expect(body.get("status") == "Failure", f"{where}.status: {body.get('status')!r}, not 'Failure'")

    # -- HTTP --------------------------------------------------------------------------
    def request(self, target, token=True, stream=False):
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.tls, timeout=SOCKET_TIMEOUT_S)
        headers = {"Accept": "application/json"}
        if token is True:
            headers["Authorization"] = "Bearer " + self.token
        elif token:
            headers["Authorization"] = "Bearer " + token
        conn.request("GET", target, headers=headers)
        resp = conn.getresponse()
        self.responses += 1
        if stream:
            return conn, resp
        body = resp.read()
        conn.close()
        return resp, body

    def get_json(self, target, where, status, token=True):
        resp, body = self.request(target, token)
        if not self.expect(resp.status == status, f"{where}: HTTP {resp.status}, expected {status}: {body[:200]!r}"):
            return None
        ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip()
        self.expect(ctype == "application/json", f"{where}: Content-Type {resp.getheader('Content-Type')!r}")
        try:
            return json.loads(body)
        except ValueError:
            self.bad(f"{where}: the body is not JSON: {body[:200]!r}")
            return None

    def watch(self, rv, where):
        """Reads a watch to its end; returns the parsed events."""
        q = urllib.parse.urlencode({"watch": "true", "allowWatchBookmarks": "true",
                                    "resourceVersion": rv, "timeoutSeconds": str(WATCH_SECONDS)})
        started = time.monotonic()
        conn, resp = self.request("/api/v1/pods?" + q, stream=True)
        events = []
        try:
            if resp.status != 200:
                self.expect(False, f"{where}: HTTP {resp.status}: {resp.read(200)!r}")
                return events
            self.checks += 1
            ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip()
            self.expect(ctype == "application/json", f"{where}: Content-Type {resp.getheader('Content-Type')!r}")
            while True:
                try:
                    line = resp.readline(1 << 20)
                except (socket.timeout, TimeoutError):
                    self.bad(f"{where}: no line and no end within {SOCKET_TIMEOUT_S} s "
                             f"(timeoutSeconds={WATCH_SECONDS} should have ended it)")
                    break
                if not line:
                    break
                if not line.strip():
                    continue
                if len(events) >= 1000:
                    self.bad(f"{where}: more than 1000 events")
                    break
                try:
                    events.append(json.loads(line))
                except ValueError:
                    self.bad(f"{where}: a line is not JSON: {line[:200]!r}")
        finally:
            conn.close()
        self.watch_events = getattr(self, "watch_events", 0) + len(events)
        took = time.monotonic() - started
        self.expect(took < WATCH_SECONDS + 3,
                    f"{where}: the watch took {took:.1f} s with timeoutSeconds={WATCH_SECONDS}")
        return events

    def check_event(self, ev, where):
        self.validate(ev, WATCH_EVENT, where)
        if not isinstance(ev, dict):
            return None
        kinds = self.schemas[WATCH_EVENT].get("event_types") or {}
        etype, obj = ev.get("type"), ev.get("object")
        if not self.expect(etype in kinds, f"{where}.type: {etype!r} is not one of {', '.join(kinds)}"):
            return None
        where = f"{where}({etype}).object"
        if kinds[etype] == STATUS:
            self.validate(obj, STATUS, where)
        elif etype == "BOOKMARK":
            # A bookmark's object is a Pod that carries only its kind and metadata.resourceVersion.
            self.validate(obj, POD, where, types_only=True)
            rv = ((obj or {}).get("metadata") or {}).get("resourceVersion")
            self.expect(isinstance(rv, str) and rv != "", f"{where}.metadata.resourceVersion: missing")
        else:
            uid = ((obj or {}).get("metadata") or {}).get("uid") if isinstance(obj, dict) else None
            want = next((p for p in PODS if p["uid"] == uid), None)
            if self.expect(want is not None, f"{where}: a pod with uid {uid!r} that the fake was not given"):
                self.check_pod(obj, where, want)
        return etype

    # -- the run -----------------------------------------------------------------------
    def setup(self, tmp):
        def openssl(*args):
            try:
                r = subprocess.run(["openssl", *args], cwd=tmp, capture_output=True, timeout=15)
            except FileNotFoundError as e:
                raise CannotRun("openssl is not installed") from e
            if r.returncode != 0:
                raise CannotRun(f"openssl {args[0]} failed: {r.stderr.decode(errors='replace')[-400:]}")

        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=kube-shapes-test-ca", "-keyout", "ca.key",
                "-out", "ca.crt", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        openssl("req", *ec, "-subj", "/CN=kube-apiserver", "-keyout", "tls.key", "-out", "tls.csr")
        with open(os.path.join(tmp, "ext.cnf"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                    "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
        openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "1", "-extfile", "ext.cnf", "-out", "tls.crt")
        with open(os.path.join(tmp, "pods.json"), "w") as f:
            json.dump(PODS, f)
        self.token = secrets.token_hex(16)
        self.tls = ssl.create_default_context(cafile=os.path.join(tmp, "ca.crt"))
        port_file = os.path.join(tmp, "port")
        self.log_path = os.path.join(tmp, "fake.log")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [self.binary, os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key"), "127.0.0.1", self.token,
             os.path.join(tmp, "pods.json"), port_file],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        until = time.monotonic() + 5
        while time.monotonic() < until:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with {rc}"
                raise FakeFailed(f"the fake {how} before writing its port, started with PODS.json "
                                 f"{json.dumps(PODS)}; its output: {self.fake_log()}")
            try:
                with open(port_file) as f:
                    text = f.read()
                if text.endswith("\n") and text.strip().isdigit():
                    self.port = int(text)
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        raise FakeFailed(f"the fake wrote no port within 5 s; its output: {self.fake_log()}")

    def fake_log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-600:].decode(errors="replace").strip() or "(no output)"
        except OSError:
            return "(no output)"

    def stop(self):
        proc = getattr(self, "proc", None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=3)

    def run_checks(self):
        by_uid = {p["uid"]: p for p in PODS}

        # The paged list, as podlinkd asks for it: limit=1, so two pods make two pages.
        seen, token, rvs, pages = [], None, set(), 0
        self.pages = 0
        self.watch_events = 0
        while True:
            q = {"limit": "1"}
            if token is not None:
                q["continue"] = token
            where = f"list page {pages + 1}"
            body = self.get_json("/api/v1/pods?" + urllib.parse.urlencode(q), where, 200)
            pages += 1
            self.pages = pages
            if body is None:
                break
            self.validate(body, POD_LIST, where)
            self.expect(body.get("kind") == "PodList" and body.get("apiVersion") == "v1",
                        f"{where}: kind/apiVersion {body.get('kind')!r}/{body.get('apiVersion')!r}, not PodList/v1")
            meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
            rv = meta.get("resourceVersion")
            self.expect(isinstance(rv, str) and rv != "", f"{where}.metadata.resourceVersion: empty")
            rvs.add(rv)
            items = body.get("items") if isinstance(body.get("items"), list) else []
            self.expect(len(items) == 1, f"{where}: {len(items)} items with limit=1")
            for i, item in enumerate(items):
                uid = ((item or {}).get("metadata") or {}).get("uid") if isinstance(item, dict) else None
                if self.expect(uid in by_uid, f"{where}.items[{i}]: uid {uid!r} is not a pod the fake was given"):
                    self.check_pod(item, f"{where}.items[{i}]", by_uid[uid])
                    seen.append(uid)
            more = len(seen) < len(PODS)
            if more:
                ok = self.expect(isinstance(meta.get("continue"), str) and meta.get("continue") != "",
                                 f"{where}.metadata.continue: missing with {len(PODS) - len(seen)} pods to come")
                self.expect(meta.get("remainingItemCount") == len(PODS) - len(seen),
                            f"{where}.metadata.remainingItemCount: {meta.get('remainingItemCount')!r}, "
                            f"{len(PODS) - len(seen)} pods remain")
                if not ok:
                    break
                token = meta["continue"]
            else:
                self.expect(not meta.get("continue"), f"{where}.metadata.continue: set on the last page")
                self.expect("remainingItemCount" not in meta,
                            f"{where}.metadata.remainingItemCount: set on the last page")
                break
            if pages >= len(PODS) + 2:
                self.bad("list: the pages do not end")
                break
        self.expect(sorted(seen) == sorted(by_uid), f"list: got pods {sorted(seen)}, expected {sorted(by_uid)}")
        self.expect(len(rvs) == 1, f"list: the pages carry different resourceVersions {sorted(rvs)} "
                                   f"(a continued list is one snapshot)")
        list_rv = next(iter(rvs)) if rvs else "0"

        # The list with a label selector (podlinkd's --kube-label-selector); the fake's pods carry app=test.
        body = self.get_json("/api/v1/pods?" + urllib.parse.urlencode({"limit": "500", "labelSelector": "app=test"}),
                             "list with labelSelector", 200)
        if body is not None:
            self.validate(body, POD_LIST, "list with labelSelector")
            self.expect(len(body.get("items") or []) == len(PODS),
                        f"list with labelSelector: {len(body.get('items') or [])} items, expected {len(PODS)}")

        # Get each pod by name, and one that does not exist.
        for p in PODS:
            where = f"get {p['namespace']}/{p['name']}"
            path = f"/api/v1/namespaces/{urllib.parse.quote(p['namespace'])}/pods/{urllib.parse.quote(p['name'])}"
            body = self.get_json(path, where, 200)
            if body is not None:
                self.check_pod(body, where, p)
                self.expect((body.get("metadata") or {}).get("uid") == p["uid"], f"{where}: another uid")
        body = self.get_json("/api/v1/namespaces/team-a/pods/no-such-pod", "get of a missing pod", 404)
        if body is not None:
            self.check_status(body, "get of a missing pod", 404, "NotFound")

        # Without the token, and with a wrong one: 401 with a Status.
        for where, target, token in (("list without a token", "/api/v1/pods?limit=1", None),
                                     ("get without a token", "/api/v1/namespaces/team-a/pods/trainer-0", None),
                                     ("list with a wrong token", "/api/v1/pods?limit=1", "not-" + self.token)):
            body = self.get_json(target, where, 401, token=token)
            if body is not None:
                self.check_status(body, where, 401, "Unauthorized")

        # A watch from the list's version (nothing changed since: it may end with no event).
        for i, ev in enumerate(self.watch(list_rv, f"watch from {list_rv}")):
            self.check_event(ev, f"watch from {list_rv} event {i}")

        # A watch from version 1: the fake replays its history (both pods ADDED). A real server would
        # likely answer an ERROR event with a 410 Status for a version that old; the fake does so only
        # after a compaction, which this process cannot ask for, so either answer is checked for shape.
        events = self.watch("1", "watch from 1")
        types = [self.check_event(ev, f"watch from 1 event {i}") for i, ev in enumerate(events)]
        if types == ["ERROR"]:
            self.expect((events[0].get("object") or {}).get("code") == 410, "watch from 1: an ERROR that is not 410")
        else:
            added = {((ev.get("object") or {}).get("metadata") or {}).get("uid")
                     for ev, t in zip(events, types) if t in ("ADDED", "MODIFIED")}
            self.expect(added == set(by_uid), f"watch from 1: ADDED/MODIFIED for {sorted(x for x in added if x)}, "
                                              f"expected every pod {sorted(by_uid)}")
            rvs = [int(((ev.get("object") or {}).get("metadata") or {}).get("resourceVersion") or 0)
                   for ev in events if isinstance(ev, dict)]
            self.expect(rvs == sorted(rvs), f"watch from 1: resourceVersions out of order {rvs}")


def check_fake(shapes, binary, shapes_name="kube_api_shapes.json"):
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise CannotRun(f"{binary} is not an executable file")
    started = time.monotonic()
    check = FakeCheck(shapes, binary)
    tmp = tempfile.mkdtemp(prefix="kube-api-shapes-")

    def out_of_time(signum, frame):
        raise OutOfTime()

    def terminated(signum, frame):
        raise KeyboardInterrupt()

    old_alarm = signal.signal(signal.SIGALRM, out_of_time)
    old_term = signal.signal(signal.SIGTERM, terminated)
    signal.alarm(DEADLINE_S)
    try:
        check.setup(tmp)
        check.run_checks()
    except OutOfTime:
        check.bad(f"the checks did not finish within {DEADLINE_S} s")
    except FakeFailed as e:
        check.bad(str(e))
    except (ssl.SSLError, ssl.CertificateError) as e:
        check.bad(f"TLS with the fake failed: {e}")
    except (OSError, http.client.HTTPException) as e:
        if isinstance(e, (ConnectionError, socket.timeout, TimeoutError, http.client.HTTPException)):
            check.bad(f"talking to the fake failed: {type(e).__name__}: {e}")
        else:
            raise
    finally:
        signal.alarm(0)
        try:
            check.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            signal.signal(signal.SIGALRM, old_alarm)
            signal.signal(signal.SIGTERM, old_term)
    took = time.monotonic() - started
    if check.problems:
        print(f"FAILED: the fake ({binary}) does not match {shapes_name}, {len(check.problems)} problem(s):",
              file=sys.stderr)
        for p in check.problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"PASSED: {os.path.basename(binary)} matches {shapes_name}: {check.responses} responses "
          f"({check.pages} list pages, a labelSelector list, {len(PODS)} gets and a 404, three 401s, "
          f"2 watches with {check.watch_events} events), {check.checks} checks, {took:.1f} s")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--openapi", metavar="FILE", help="the upstream OpenAPI v3 document for core/v1")
    ap.add_argument("--fake", metavar="BINARY", help="the fake_kube_apiserver executable")
    ap.add_argument("--shapes", metavar="FILE", default=DEFAULT_SHAPES,
                    help="the shapes file (default: kube_api_shapes.json beside this script)")
    args = ap.parse_args(argv)
    if not args.openapi and not args.fake:
        ap.error("give --openapi FILE, --fake BINARY, or both")
    try:
        shapes = load_json(args.shapes)
        rc = 0
        if args.openapi:
            rc = max(rc, check_openapi(shapes, args.openapi, os.path.basename(args.shapes)))
        if args.fake:
            rc = max(rc, check_fake(shapes, args.fake, os.path.basename(args.shapes)))
        return rc
    except CannotRun as e:
        print(f"cannot check: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
