"""Machine description files (TOML): parsing and validation.

A description holds ``[model]`` (name, gravity), ``[[bodies]]``, ``[[joints]]``,
``[[actuators]]``, an optional ``[assembly]`` (actuator values of the guess) and an optional
``[tool]`` (a point on a body, and for 6-DOF machines the body's orientation: the task
coordinates of task-space motion). Body poses
are the assembly guess: they select the branch. Every error names the file, the table and the
field. Units are SI: m, kg, kg m^2, rad.

Optional protection fields (``pkrt.rt.core.protection``; checked by
``pkrt.models.kinematics.passive``): a joint's ``cone`` (spherical and universal: the largest
angle between the joint's axis as fixed in body 1 and as fixed in body 2, which coincide at the
guess; ``cone_axis`` gives that axis, world, at the guess) or ``range`` (passive revolute, rad,
or prismatic, m: the joint's value as an actuated one would have it, without offset), and a
body's ``radius`` (a capsule: the points within it of the body's ``segment``, two points in
world at the guess, by default the centres of its two joints). They do not change the
dynamics: the content hash leaves their lines out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.filekind import MODEL, expect
from pkrt.rt.core.inputs import excerpt, read_toml
from pkrt.rt.core.protection import FIELDS as PROTECTION, dynamics_hash
from pkrt.rt.core.schema import LARGEST, field_message, finite_real, key_text, unknown_key, unknown_what

from .joints import ACTUATABLE, JOINT_TYPES


class ModelError(UserError, ValueError):
    """A machine description is invalid; the message names file, table and field."""


GROUND = "ground"
# a body's inertia: negative principal moments and violations of the triangle inequality are
# tolerated up to this fraction of its largest moment (rounding; ``pkrt identify`` writes its
# inertias at least 1000 times this inside: ``models.identify.INERTIA_MARGIN``)
INERTIA_RTOL = 1e-9
# the fields of each table (a key not listed is refused: a typo in an optional field);
# [identification] and [calibration] are provenance that `pkrt identify` and `pkrt calibrate`
# write (free-form, never read here)
KEYS = {
    "": ("model", "bodies", "joints", "actuators", "assembly", "tool", "identification", "calibration"),
    "model": ("name", "gravity", "singular_threshold"),
    "bodies": ("name", "mass", "inertia", "com", "position", "rotation", *PROTECTION["bodies"]),
    "joints": ("name", "type", "body1", "body2", "point1", "point2", "axis1", "axis2", "ref1", "ref2",
               "at", "axis", "ref", *PROTECTION["joints"]),
    "actuators": ("name", "joint", "range", "offset", "scale"),
    "assembly": ("theta",),
    "tool": ("body", "point", "rotation", "coordinates"),
}
MACHINES_DIR = Path(__file__).resolve().parent.parent / "machines"


@dataclass(frozen=True)
class Body:
    name: str
    mass: float  # kg
    com: np.ndarray  # centre of mass in the body frame (m)
    inertia: np.ndarray  # about the centre of mass, body frame (kg m^2)
    position: np.ndarray  # body frame origin in world at the guess (m)
    rotation: np.ndarray  # body to world rotation matrix at the guess
    radius: float | None = None  # m: a capsule of this radius around ``segment``
    segment: np.ndarray | None = None  # (2, 3): the capsule's end points in the body frame (m)


@dataclass(frozen=True)
class JointSpec:
    name: str
    type: str
    body1: str
    body2: str
    point1: np.ndarray  # in body 1 frame (m)
    point2: np.ndarray
    axis1: np.ndarray  # unit, body 1 frame
    axis2: np.ndarray
    ref1: np.ndarray
    ref2: np.ndarray
    cone: float | None = None  # rad: half-angle (spherical, universal)
    cone_axis1: np.ndarray | None = None  # the cone's axis in body 1's frame (unit)
    cone_axis2: np.ndarray | None = None  # ... in body 2's frame (the same world vector at the guess)
    range: tuple[float, float] | None = None  # passive revolute (rad) or prismatic (m) joint's value


@dataclass(frozen=True)
class ActuatorSpec:
    name: str
    joint: str
    range: tuple[float, float]
    offset: float  # joint value = scale theta + offset (m or rad)
    unit: str
    scale: float = 1.0  # joint value per unit of theta (a screw lead's or an encoder's error)


TASK_AXES = ("x", "y", "z", "roll", "pitch", "yaw")


@dataclass(frozen=True)
class ToolSpec:
    """The tool: a point on a body and the task coordinates it defines.

    ``coordinates`` is a subset of x, y, z (world position of the point, m) followed, for a
    6-DOF machine, by roll, pitch, yaw (rad) of the tool frame R_body R_tool, with
    R = Rz(yaw) Ry(pitch) Rx(roll)."""
    body: str
    point: np.ndarray  # in the body's frame as given in the file (m)
    rotation: np.ndarray  # tool frame in the body frame (rotation matrix)
    coordinates: tuple[str, ...]

    @property
    def orientation(self) -> bool:
        return "roll" in self.coordinates


@dataclass(frozen=True)
class Description:
    name: str
    path: str
    content_hash: str  # sha256 of the file without its protection lines (``protection.dynamics_hash``)
    gravity: np.ndarray
    bodies: tuple[Body, ...]
    joints: tuple[JointSpec, ...]
    actuators: tuple[ActuatorSpec, ...]
    theta_guess: np.ndarray
    singular_threshold: float  # trees: boxes with a smaller singularity measure are out of domain
    tool: ToolSpec | None = None


def resolve_model_path(name_or_path: str) -> Path:
    """A built-in machine name (``fourbar``) or a path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix == "" and not p.exists():
        p = MACHINES_DIR / f"{name_or_path}.toml"
        if not p.exists():
            known = sorted(x.stem for x in MACHINES_DIR.glob("*.toml") if "-" not in x.stem)
            raise ModelError(f"{name_or_path}: no such model file or built-in model (built-in: {', '.join(known)})")
    if not p.exists():
        raise ModelError(f"{p}: no such file")
    return p


def rotation_from_vector(rv) -> np.ndarray:
    """Rotation matrix of a rotation vector (axis times angle, rad)."""
    rv = np.asarray(rv, dtype=float)
    big = np.abs(rv).max()
    if big < 1e-300:
        return np.eye(3)
    k = rv / big  # scaled first: no overflow in the norm
    a = big * np.linalg.norm(k)
    k = k / np.linalg.norm(k)
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(a) * K + (1 - np.cos(a)) * K @ K


class _Reader:
    """Typed field access with errors that name file, table and field."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, field: str | None, msg: str):
        raise ModelError(field_message(self.path, where, field, msg))

    def keys(self, tbl: dict, where: str, table: str) -> None:
        """Refuse a key that is not a field of ``table`` (``KEYS``)."""
        key = unknown_key(tbl, KEYS[table])
        if key is not None:
            if table == "":
                self.fail(f"[{key}]", None, f"unknown table (known: {', '.join(KEYS[''])})")
            self.fail(where, key, unknown_what(KEYS[table]))

    def number(self, tbl, where, field, default=None, positive=False):
        if field not in tbl:
            if default is None:
                self.fail(where, field, "missing")
            return float(default)
        v = tbl[field]
        if not finite_real(v):
            self.fail(where, field, f"must be a finite number of magnitude at most {LARGEST:g}, got {excerpt(v)}")
        if positive and v <= 0:
            self.fail(where, field, f"must be positive, got {excerpt(v)}")
        return float(v)

    def string(self, tbl, where, field, default=None):
        if field not in tbl:
            if default is None:
                self.fail(where, field, "missing")
            return default
        v = tbl[field]
        if not isinstance(v, str) or not v:
            self.fail(where, field, f"must be a non-empty string, got {excerpt(v)}")
        return v

    def vector(self, tbl, where, field, n=3, default=None, unit=False):
        if field not in tbl:
            if default is None:
                self.fail(where, field, "missing")
            return None if isinstance(default, str) else np.asarray(default, dtype=float)
        v = tbl[field]
        if not isinstance(v, list) or len(v) != n or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                             for x in v):
            self.fail(where, field, f"must be a list of {n} numbers, got {excerpt(v)}")
        if not all(finite_real(x) for x in v):
            self.fail(where, field, f"must be finite numbers of magnitude at most {LARGEST:g}, got {excerpt(v)}")
        a = np.asarray(v, dtype=float)
        if unit:
            big = np.abs(a).max()
            if big < 1e-12:
                self.fail(where, field, "must be a non-zero vector")
            a = a / big  # scaled first: no overflow in the norm
            a = a / np.linalg.norm(a)
        return a

    def entry(self, tbl, i: int, key: str, seen: list[str]) -> tuple[str, str]:
        """Name and location of the i-th entry of [[key]]; its name must be new."""
        name = tbl.get("name") if isinstance(tbl.get("name"), str) else f"#{i + 1}"
        where = f"[[{key}]] '{key_text(name)}'"
        self.string(tbl, where, "name")
        if name in seen:
            self.fail(where, "name", f"duplicate {key[:-1]} name")
        return name, where

    def table_list(self, doc, key):
        v = doc.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            self.fail(f"[[{key}]]", None, "must be an array of tables")
        return v


def load_description(name_or_path: str) -> Description:
    """Read and validate a machine description (no assembly)."""
    path = resolve_model_path(name_or_path)
    expect(path, MODEL, ModelError)  # another kind of file: say what it is
    raw = path.read_bytes()
    doc = read_toml(path, ModelError)
    r = _Reader(str(path))

    model = doc.get("model")
    if not isinstance(model, dict):
        r.fail("[model]", None, "table missing")
    r.keys(model, "[model]", "model")
    name = r.string(model, "[model]", "name")
    gravity = r.vector(model, "[model]", "gravity")
    sing = r.number(model, "[model]", "singular_threshold", default=1e-3, positive=True)

    bodies: list[Body] = []
    for i, b in enumerate(r.table_list(doc, "bodies")):
        bname, where = r.entry(b, i, "bodies", [x.name for x in bodies])
        r.keys(b, where, "bodies")
        if bname == GROUND:
            r.fail(where, "name", "'ground' is reserved for the fixed frame")
        mass = r.number(b, where, "mass", positive=True)
        inertia = _inertia(r, b, where)
        body = Body(bname, mass, r.vector(b, where, "com", default=(0, 0, 0)), inertia,
                    r.vector(b, where, "position", default=(0, 0, 0)),
                    rotation_from_vector(r.vector(b, where, "rotation", default=(0, 0, 0))))
        bodies.append(_capsule(r, b, where, body))
    if not bodies:
        r.fail("[[bodies]]", None, "no bodies")
    by_name = {b.name: b for b in bodies}

    joints: list[JointSpec] = []
    for i, j in enumerate(r.table_list(doc, "joints")):
        jname, where = r.entry(j, i, "joints", [x.name for x in joints])
        r.keys(j, where, "joints")
        jtype = r.string(j, where, "type")
        if jtype not in JOINT_TYPES:
            r.fail(where, "type", f"unknown joint type '{jtype}' (known: {', '.join(JOINT_TYPES)})")
        names = []
        for field in ("body1", "body2"):
            bn = r.string(j, where, field)
            if bn != GROUND and bn not in by_name:
                r.fail(where, field, f"no body named '{bn}' (bodies: {', '.join(by_name)}, ground)")
            names.append(bn)
        if names[0] == names[1]:
            r.fail(where, "body2", "a joint must connect two different bodies")
        joints.append(_joint_limits(r, j, where, _joint_frames(r, j, where, jname, jtype, names, by_name), by_name))
    if not joints:
        r.fail("[[joints]]", None, "no joints")
    jby = {j.name: j for j in joints}
    bodies = [_segment(r, b, joints) for b in bodies]

    actuators: list[ActuatorSpec] = []
    for i, a in enumerate(r.table_list(doc, "actuators")):
        aname, where = r.entry(a, i, "actuators", [x.name for x in actuators])
        r.keys(a, where, "actuators")
        jn = r.string(a, where, "joint")
        if jn not in jby:
            r.fail(where, "joint", f"no joint named '{jn}'")
        if jby[jn].type not in ACTUATABLE:
            r.fail(where, "joint", f"joint '{jn}' is {jby[jn].type}; only {' and '.join(ACTUATABLE)} joints can be actuated")
        if any(x.joint == jn for x in actuators):
            r.fail(where, "joint", f"joint '{jn}' is already actuated")
        if jby[jn].range is not None:
            r.fail(f"[[joints]] '{jn}'", "range", f"the joint is actuated (by '{aname}'): its actuator's range bounds it")
        rng = r.vector(a, where, "range", n=2)
        if not rng[0] < rng[1]:
            r.fail(where, "range", f"empty range [{rng[0]}, {rng[1]}] (need lower < upper)")
        unit = "rad" if jby[jn].type == "revolute" else "m"
        actuators.append(ActuatorSpec(aname, jn, (float(rng[0]), float(rng[1])),
                                      r.number(a, where, "offset", default=0.0), unit,
                                      r.number(a, where, "scale", default=1.0, positive=True)))
    if not actuators:
        r.fail("[[actuators]]", None, "no actuators")

    asm = doc.get("assembly", {})
    if not isinstance(asm, dict):
        r.fail("[assembly]", None, "must be a table")
    r.keys(asm, "[assembly]", "assembly")
    mid = [0.5 * (a.range[0] + a.range[1]) for a in actuators]
    theta = r.vector(asm, "[assembly]", "theta", n=len(actuators), default=mid)
    tool = _tool(r, doc, by_name, len(actuators)) if "tool" in doc else None
    r.keys(doc, "", "")  # last: a misspelt [model] is reported as missing
    try:
        content_hash = dynamics_hash(raw, str(path), doc)
    except UserError as e:
        raise ModelError(str(e)) from None
    return Description(name, str(path), content_hash, gravity, tuple(bodies),
                       tuple(joints), tuple(actuators), theta, sing, tool)


def _capsule(r: _Reader, b: dict, where: str, body: Body) -> Body:
    """``radius`` (m) and ``segment`` (two points, world, at the guess) of a body."""
    if "segment" in b and "radius" not in b:
        r.fail(where, "segment", "a segment without 'radius' (the capsule's radius, m)")
    if "radius" not in b:
        return body
    radius = r.number(b, where, "radius", positive=True)
    seg = b.get("segment")
    if seg is None:
        return dataclasses.replace(body, radius=radius)
    if not isinstance(seg, list) or len(seg) != 2:
        r.fail(where, "segment", f"must be two points [[x, y, z], [x, y, z]] (m, world, at the guess), got {excerpt(seg)}")
    pts = [r.vector({"segment": p}, where, "segment") for p in seg]
    local = np.array([body.rotation.T @ (p - body.position) for p in pts])
    return dataclasses.replace(body, radius=radius, segment=local)


def _segment(r: _Reader, body: Body, joints) -> Body:
    """A body's capsule segment by default: the centres of its two joints (in its frame)."""
    if body.radius is None or body.segment is not None:
        return body
    pts = [j.point1 if j.body1 == body.name else j.point2 for j in joints if body.name in (j.body1, j.body2)]
    if len(pts) != 2 or np.linalg.norm(pts[0] - pts[1]) < 1e-9:
        why = (f"its {len(pts)} joints are at one point" if len(pts) == 2 else f"it has {len(pts)} joint(s), not 2")
        r.fail(f"[[bodies]] '{body.name}'", "segment",
               f"missing: the capsule's segment defaults to the centres of the body's two joints, but {why}; "
               f"give 'segment' = [[x, y, z], [x, y, z]] (m, world, at the guess)")
    return dataclasses.replace(body, segment=np.array(pts))


def _joint_limits(r: _Reader, j: dict, where: str, spec: JointSpec, by_name) -> JointSpec:
    """``cone`` (and ``cone_axis``) or ``range`` of a joint."""
    if "cone_axis" in j and "cone" not in j:
        r.fail(where, "cone_axis", "an axis without 'cone' (the cone's half-angle, rad)")
    out = spec
    if "cone" in j:
        if spec.type not in ("spherical", "universal"):
            r.fail(where, "cone", f"a {spec.type} joint has no cone (spherical and universal joints do; "
                                  f"a revolute or prismatic joint has a 'range')")
        cone = r.number(j, where, "cone", positive=True)
        if cone >= np.pi:
            r.fail(where, "cone", f"must be a half-angle below pi rad, got {cone!r}")
        R1 = np.eye(3) if spec.body1 == GROUND else by_name[spec.body1].rotation
        R2 = np.eye(3) if spec.body2 == GROUND else by_name[spec.body2].rotation
        if "cone_axis" in j:
            w = r.vector(j, where, "cone_axis", unit=True)
        elif spec.type == "universal":  # the shafts' direction: across both cross axes
            w = np.cross(R1 @ spec.axis1, R2 @ spec.axis2)
            w /= np.linalg.norm(w)
        else:
            r.fail(where, "cone_axis", "missing: a spherical joint's cone needs its axis (the ball stud's direction, "
                                       "world, at the guess)")
        out = dataclasses.replace(spec, cone=cone, cone_axis1=R1.T @ w, cone_axis2=R2.T @ w)
    if "range" in j:
        if spec.type not in ("revolute", "prismatic"):
            r.fail(where, "range", f"a {spec.type} joint has no range (revolute and prismatic joints do; a "
                                   f"spherical or universal joint has a 'cone')")
        lo, hi = r.vector(j, where, "range", n=2)
        unit = "rad" if spec.type == "revolute" else "m"
        if not lo < hi:
            r.fail(where, "range", f"empty range [{lo:g}, {hi:g}] {unit} (need lower < upper)")
        if spec.type == "revolute" and (lo <= -np.pi or hi >= np.pi):
            r.fail(where, "range", f"[{lo:g}, {hi:g}] rad must lie inside (-pi, pi)")
        out = dataclasses.replace(out, range=(float(lo), float(hi)))
    return out


def _tool(r: _Reader, doc, by_name, n_act: int) -> ToolSpec:
    """``[tool]``: body, point (body frame, m), optional rotation (rotation vector of the
    tool frame in the body frame) and coordinates (default x, y, z)."""
    t = doc["tool"]
    where = "[tool]"
    if not isinstance(t, dict):
        r.fail(where, None, "must be a table")
    r.keys(t, where, "tool")
    body = r.string(t, where, "body")
    if body not in by_name:
        r.fail(where, "body", f"no body named '{body}' (bodies: {', '.join(by_name)})")
    point = r.vector(t, where, "point", default=(0, 0, 0))
    rot = rotation_from_vector(r.vector(t, where, "rotation", default=(0, 0, 0)))
    coords = t.get("coordinates", ["x", "y", "z"])
    if not isinstance(coords, list) or not all(isinstance(c, str) for c in coords):
        r.fail(where, "coordinates", f"must be a list of names, got {excerpt(coords)}")
    bad = [c for c in coords if c not in TASK_AXES]
    if bad:
        r.fail(where, "coordinates", f"unknown coordinate '{bad[0]}' (known: {', '.join(TASK_AXES)})")
    if len(set(coords)) != len(coords) or list(coords) != [c for c in TASK_AXES if c in coords]:
        r.fail(where, "coordinates", f"must be distinct and in the order {', '.join(TASK_AXES)}, got {excerpt(coords)}")
    ang = [c for c in coords if c in TASK_AXES[3:]]
    if ang and len(ang) != 3:
        r.fail(where, "coordinates", "orientation needs all of roll, pitch, yaw")
    if len(ang) == len(coords):
        r.fail(where, "coordinates", "needs at least one of x, y, z")
    if len(coords) != n_act:
        r.fail(where, "coordinates", f"{len(coords)} task coordinate(s) ({', '.join(coords)}) for "
                                      f"{n_act} actuator(s): they must be as many")
    return ToolSpec(body, point, rot, tuple(coords))


def _inertia(r: _Reader, b, where) -> np.ndarray:
    if "inertia" not in b:
        r.fail(where, "inertia", "missing")
    v = b["inertia"]
    if not (_three_numbers(v) or isinstance(v, list) and len(v) == 3 and all(_three_numbers(x) for x in v)):
        r.fail(where, "inertia", f"must be 3 principal moments or a 3x3 matrix of finite numbers (magnitude at most "
                                 f"{LARGEST:g}), got {excerpt(v)}")
    a = np.asarray(v, dtype=float)
    if a.shape == (3,):
        a = np.diag(a)
    if not np.allclose(a, a.T, rtol=0, atol=1e-12 * max(1.0, np.abs(a).max())):
        r.fail(where, "inertia", "not symmetric")
    ev = np.linalg.eigvalsh(a)
    tol = INERTIA_RTOL * max(ev.max(), 1e-300)
    if ev.min() < -tol:
        r.fail(where, "inertia", f"not positive semidefinite (eigenvalues {ev.round(12).tolist()})")
    if ev[0] + ev[1] < ev[2] - tol:
        # a zero moment is allowed (a slender rod's own axis), but only as a physical body has it
        r.fail(where, "inertia", f"principal moments {ev.round(12).tolist()} violate the triangle "
                                 f"inequality (no rigid body has them)")
    return a


def _three_numbers(v) -> bool:
    return isinstance(v, list) and len(v) == 3 and all(finite_real(x) for x in v)


def _joint_frames(r: _Reader, j, where, name, jtype, names, by_name) -> JointSpec:
    """Joint frames on each body: explicit (point1/axis1/ref1 in body 1, ...) or from world
    values at the guess (``at``, ``axis``, ``ref``), mapped into each body's frame."""

    def pose(bn):
        if bn == GROUND:
            return np.zeros(3), np.eye(3)
        return by_name[bn].position, by_name[bn].rotation

    (x1, R1), (x2, R2) = pose(names[0]), pose(names[1])
    at = r.vector(j, where, "at", default="none")
    axis = r.vector(j, where, "axis", default="none", unit=True)
    ref = r.vector(j, where, "ref", default="none", unit=True)

    def local(field, world, x, R, default_world, is_point):
        v = r.vector(j, where, field, default="none", unit=not is_point)
        if v is not None:
            return v
        w = world if world is not None else default_world
        if w is None:
            r.fail(where, field, f"missing (give '{field}' or the world value '{'at' if is_point else field[:-1]}')")
        return R.T @ (w - x) if is_point else R.T @ w

    p1 = local("point1", at, x1, R1, None, True)
    p2 = local("point2", at, x2, R2, x1 + R1 @ p1, True)
    needs_axis = jtype != "spherical"
    a1 = local("axis1", axis, x1, R1, np.array([0.0, 0.0, 1.0]) if not needs_axis else None, False)
    a2 = local("axis2", None, x2, R2, R1 @ a1, False)
    if jtype == "universal" and "axis2" not in j:
        r.fail(where, "axis2", "missing (a universal joint needs its second axis, in body 2)")
    if jtype == "universal" and abs((R1 @ a1) @ (R2 @ a2)) > 1e-6:
        r.fail(where, "axis2", "universal joint axes must be perpendicular at the guess")
    rf1 = local("ref1", ref, x1, R1, _any_perp(R1 @ a1), False)
    rf2 = local("ref2", None, x2, R2, R1 @ rf1, False)
    for field, ax, rv in (("ref1", a1, rf1), ("ref2", a2, rf2)):
        if jtype in ("revolute", "prismatic", "fixed") and abs(ax @ rv) > 1 - 1e-9:
            r.fail(where, field, "must not be parallel to the joint axis")
    return JointSpec(name, jtype, names[0], names[1], p1, p2, a1, a2, rf1, rf2)


def _any_perp(a: np.ndarray) -> np.ndarray:
    h = np.array([1.0, 0.0, 0.0]) if abs(a[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    u = np.cross(h, a)
    return u / np.linalg.norm(u)
