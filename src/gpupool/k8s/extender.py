"""The scheduler extender: filter, prioritize and bind pods that ask for gpupool GPUs.

It speaks the kube-scheduler extender JSON (k8s.io/kube-scheduler/extender/v1): ExtenderArgs in,
ExtenderFilterResult, HostPriorityList and ExtenderBindingResult out. What every pod holds is
kept in a cache; the pods' annotations are the source of truth, so a restarted extender (or a
node whose pods finished) is re-read from the API server.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
from collections import defaultdict
from typing import Any

from gpupool.core.errors import GpupoolError, InvalidRequest, KubeApiError
from gpupool.core.resources import Priority
from gpupool.k8s import inventory, names
from gpupool.k8s.fleet import DEFAULT_POLICY, UNKNOWN_NODE, Charge, Fleet, check_policy
from gpupool.k8s.inventory import GpuInfo
from gpupool.k8s.kubeapi import Event, KubeApi, Obj
from gpupool.k8s.podshare import Allocation, placed, slot_id, waiting
from gpupool.k8s.podspec import GpuAsk, Pod, gpu_ask, gpu_count, pod_annotations, pod_key
from gpupool.scheduler.opportunistic import guaranteed_compute
from gpupool.scheduler.packing import share_prices
from gpupool.scheduler.workload import TargetWorkload

log = logging.getLogger(__name__)


def charge_of(pod: Pod) -> Charge | None:
    """What a bound pod holds, from its annotations; None for a pod gpupool did not place. A
    `low` pod holds no compute (scheduler/opportunistic.py): its annotation keeps the compute it
    asked for, which the device plugin gives the compute arbiter."""
    ann = pod_annotations(pod)
    node = (pod.get("spec") or {}).get("nodeName") or ann.get(names.ANN_NODE)
    if not node or names.ANN_GPUS not in ann:
        return None
    try:
        gpus = tuple(int(g) for g in ann[names.ANN_GPUS].split(","))
        memory = int(ann.get(names.ANN_MEMORY_BYTES, "0"))
        milli = int(ann.get(names.ANN_COMPUTE_MILLI, "1000"))
        priority = Priority(ann.get(names.ANN_PRIORITY, Priority.HIGH.value))
    except ValueError:
        log.warning("pod %s: malformed gpupool annotations, ignored", pod_key(pod))
        return None
    exclusive = ann.get(names.ANN_MODE) == "exclusive"
    return Charge(str(node), gpus, memory, guaranteed_compute(priority, milli), exclusive)


def _uid(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("uid") or pod_key(pod))


class Extender:
    """Placement over the nodes' GPUs with one policy; safe to call from many threads.

    filter and prioritize never wait on the API server (they answer from the cache, in the HTTP
    server's event loop): a node not known yet fails the filter until the background re-read
    has learnt it, and events are sent from a background thread. bind talks to the API server.
    """

    def __init__(
        self, api: KubeApi, policy: str = DEFAULT_POLICY, key: bytes | None = None
    ) -> None:
        self.api = api
        self.policy = check_policy(policy)
        #: signs what bind writes; the device plugins hold the same key (a random one serves
        #: only a test without device plugins)
        self.key = key if key is not None else secrets.token_bytes(32)
        self.fleet = Fleet()
        #: each node's GPUs by index, for the slot IDs bind chooses
        self._gpus: dict[str, dict[int, GpuInfo]] = {}
        self._lock = threading.Lock()
        # a node's lock orders its binds and its re-reads: a re-read that overlapped a bind could
        # drop the bind's charge (re-entrant: a bind re-reads its node first)
        self._node_locks: dict[str, threading.RLock] = {}
        self._held: dict[str, dict[str, Charge]] = defaultdict(dict)
        self._warned: set[tuple[str, str]] = set()
        #: None tells the sender to stop
        self._events: queue.Queue[Event | None] = queue.Queue()
        self._resync_wanted = threading.Event()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []

    def start_background(self, interval: float) -> None:
        """Threads that send events and re-read nodes and pods every `interval` seconds (at
        once when a filter met a node it does not know)."""
        self._threads = [
            threading.Thread(target=self._send_events, daemon=True),
            threading.Thread(target=self._resync_loop, args=(interval,), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """End the background threads (a re-read under way finishes first)."""
        self._stopped.set()
        self._resync_wanted.set()
        self._events.put(None)
        for thread in self._threads:
            thread.join(timeout=30)

    def _resync_loop(self, interval: float) -> None:
        while not self._stopped.is_set():
            try:
                self.resync()
            except GpupoolError as err:
                log.warning("re-reading nodes and pods failed, retrying: %s", err)
            self._resync_wanted.wait(interval)
            self._resync_wanted.clear()

    def _send_events(self) -> None:
        while (event := self._events.get()) is not None:
            try:
                self.api.create_event(event)
            except KubeApiError as err:
                log.warning("event %s not recorded: %s", event.reason, err)

    def _node_lock(self, node: str) -> threading.RLock:
        # dict.setdefault is atomic: two threads never get two locks for one node
        return self._node_locks.setdefault(node, threading.RLock())

    # -- state ----------------------------------------------------------------------------------

    def _set_inventory(self, node: Obj) -> bool:
        meta = node.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(names.ANN_NODE_GPUS)
        if text is None:
            return False
        try:
            gpus = inventory.decode(text)
            with self._lock:
                self.fleet.set_node(str(meta["name"]), gpus)
                self._gpus[str(meta["name"])] = {g.index: g for g in gpus}
        except InvalidRequest as err:
            log.warning("node %s: %s", meta.get("name"), err)
            return False
        return True

    def resync_node(self, node: str) -> None:
        """Re-read what the pods on `node` hold (finished pods give their GPUs back)."""
        with self._node_lock(node):
            self._resync_node(node)

    def _resync_node(self, node: str) -> list[Pod]:
        """Re-read `node`'s pods; returns them."""
        held = {}
        pods = self.api.list_pods_on_node(node)
        for pod in pods:
            charge = charge_of(pod)
            if charge is not None and charge.node == node:
                held[_uid(pod)] = charge
        with self._lock:
            for old in self._held[node].values():
                self.fleet.charge(old, -1)
            for new in held.values():
                self.fleet.charge(new, 1)
            self._held[node] = held
        return pods

    def resync(self) -> None:
        """Every node's inventory and pods, from the API server (at start and periodically)."""
        for node in self.api.list_nodes():
            if self._set_inventory(node):
                self.resync_node(str(node["metadata"]["name"]))

    def _learn(self, node_names: list[str], node_objs: list[Obj]) -> None:
        for obj in node_objs:
            self._set_inventory(obj)
        with self._lock:
            unknown = bool((self.fleet.lookup(node_names) < 0).any())
        if unknown:
            self._resync_wanted.set()

    def _learn_node(self, node: str) -> None:
        """Read one node the cache lacks (bind, in a worker thread, may wait for it)."""
        if node not in self.fleet.rows and self._set_inventory(self.api.get_node(node)):
            self.resync_node(node)

    # -- events ---------------------------------------------------------------------------------

    def _warn(self, pod: Pod, reason: str, message: str) -> None:
        """One Warning event per pod and reason, sent in the background."""
        key = (_uid(pod), reason)
        if key in self._warned:
            return
        self._warned.add(key)
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        self._events.put(Event(namespace, "Pod", meta.get("name", ""), "Warning", reason, message))

    # -- the three verbs ------------------------------------------------------------------------

    @staticmethod
    def _candidates(args: dict[str, Any]) -> tuple[list[str], list[Obj] | None]:
        nodes = args.get("nodes") or args.get("Nodes")
        if nodes is not None:
            items = list(nodes.get("items") or [])
            return [str(n["metadata"]["name"]) for n in items], items
        names_ = args.get("nodenames") or args.get("NodeNames") or []
        if not isinstance(names_, list):
            raise InvalidRequest("NodeNames must be a list of node names")
        return names_, None

    def _ask(self, pod: Pod) -> GpuAsk | None:
        try:
            return gpu_ask(pod)
        except InvalidRequest as err:
            self._warn(pod, "GpupoolInvalidRequest", str(err))
            raise

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        """ExtenderArgs -> ExtenderFilterResult."""
        pod: Pod = args.get("pod") or args.get("Pod") or {}
        try:
            node_names, node_objs = self._candidates(args)
        except InvalidRequest as err:
            return {"error": str(err)}
        try:
            ask = self._ask(pod)
        except InvalidRequest as err:
            return self._result([], node_objs, {}, {n: str(err) for n in node_names})
        if ask is None:
            return self._result(node_names, node_objs, {}, {})
        self._learn(node_names, node_objs or [])
        with self._lock:
            if not self._any_known(node_names):
                return self._result([], node_objs, {}, dict.fromkeys(node_names, UNKNOWN_NODE))
            fit, failed, unresolvable = self.fleet.filter(ask, node_names)
        if not fit:
            detail = next(iter({**failed, **unresolvable}.values()), "no node has gpupool GPUs")
            self._warn(pod, "GpupoolUnschedulable", f"{ask.describe()} fits no node: {detail}")
        return self._result(fit, node_objs, failed, unresolvable)

    def _any_known(self, node_names: list[str]) -> bool:
        """Whether gpupool knows the GPUs of any candidate (the placement engine needs one)."""
        return bool(node_names) and bool((self.fleet.lookup(node_names) >= 0).any())

    @staticmethod
    def _result(
        fit: list[str], objs: list[Obj] | None, failed: dict[str, str], never: dict[str, str]
    ) -> dict[str, Any]:
        result: dict[str, Any] = {"failedNodes": failed, "failedAndUnresolvableNodes": never}
        if objs is None:
            result["nodenames"] = fit
        else:
            keep = set(fit)
            result["nodes"] = {"items": [o for o in objs if o["metadata"]["name"] in keep]}
        return result

    def prioritize(self, args: dict[str, Any]) -> str:
        """ExtenderArgs -> HostPriorityList (scores 0..10), as JSON text: 10,000 entries are
        written from cached fragments rather than through 10,000 dicts."""
        pod: Pod = args.get("pod") or args.get("Pod") or {}
        try:
            node_names, node_objs = self._candidates(args)
            ask = gpu_ask(pod)
        except InvalidRequest:
            return "[]"  # filter has already said why, in an event
        if ask is None:
            return json.dumps([{"host": n, "score": 0} for n in node_names])
        self._learn(node_names, node_objs or [])
        with self._lock:
            if not self._any_known(node_names):
                return json.dumps([{"host": n, "score": 0} for n in node_names])
            scores = self.fleet.scores(ask, node_names, self.policy)
            return self.fleet.priority_json(node_names, scores)

    def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        """ExtenderBindingArgs -> ExtenderBindingResult: GPUs chosen, annotated, then bound."""
        namespace = str(args.get("podNamespace") or args.get("PodNamespace") or "default")
        name = str(args.get("podName") or args.get("PodName") or "")
        uid = str(args.get("podUID") or args.get("PodUID") or "")
        node = str(args.get("node") or args.get("Node") or "")
        try:
            with self._node_lock(node):
                self._bind(namespace, name, uid, node)
        except GpupoolError as err:
            log.warning("bind %s/%s to %s: %s", namespace, name, node, err)
            return {"error": str(err)}
        return {}

    def _bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        pod = self.api.get_pod(namespace, name)
        meta = pod.get("metadata") or {}
        if str(meta.get("uid") or "") != uid:
            raise InvalidRequest(
                f"pod {namespace}/{name} has UID {meta.get('uid')}, not {uid}: not bound"
            )
        if (pod.get("spec") or {}).get("nodeName"):
            raise InvalidRequest(f"pod {namespace}/{name} is already bound")
        ask = self._ask(pod)
        if ask is None:
            self.api.create_binding(namespace, name, uid, node)
            return
        self._learn_node(node)
        pods = self._resync_node(node)
        _one_waiting_per_size(pods, ask, node, self.key)
        with self._lock:
            gpus = self.fleet.choose(ask, node, self.policy)
            memory = self.fleet.memory_of(ask, node, gpus)
            slots = self._free_slots(node, gpus, pods)
            held = guaranteed_compute(ask.priority, ask.compute)
            charge = Charge(node, gpus, memory, held, ask.exclusive)
            self.fleet.charge(charge)
            self.fleet.bound(ask)
            self._held[node][uid] = charge
        # what it asked for, not what it holds: the device plugin hands it to the arbiter
        allocation = Allocation(
            uid, node, gpus, slots, memory, ask.compute, ask.mode, ask.priority
        ).annotations(self.key)
        written = False
        try:
            self.api.patch_pod_annotations(namespace, name, uid, allocation)
            written = True
            self.api.create_binding(namespace, name, uid, node)
        except KubeApiError:
            with self._lock:
                self.fleet.charge(charge, -1)
                self._held[node].pop(uid, None)
            if written:
                self._unwrite(namespace, name, uid, allocation)
            raise

    def debug(self) -> dict[str, Any]:
        """The policy and the target workload it scores against (GET /debug/placement)."""
        with self._lock:
            placing = getattr(self.fleet.policy(self.policy), "target", None)
            prices = share_prices(placing) if isinstance(placing, TargetWorkload) else None
            return {
                "policy": self.policy,
                "nodes": len(self.fleet.names),
                "target_workload": self.fleet.recent.describe(prices=prices),
            }

    def _unwrite(self, namespace: str, name: str, uid: str, written: dict[str, str]) -> None:
        """Remove what a failed bind wrote."""
        gone: dict[str, str | None] = dict.fromkeys(written)
        try:
            self.api.patch_pod_annotations(namespace, name, uid, gone)
        except KubeApiError as err:
            # unbound, its signature names no node it runs on: the next bind overwrites it
            log.warning("pod %s/%s: the failed bind's annotations stay: %s", namespace, name, err)

    def _free_slots(self, node: str, gpus: tuple[int, ...], pods: list[Pod]) -> tuple[str, ...]:
        """A device-plugin slot on each chosen GPU that no pod on the node holds."""
        taken = {
            s for pod in pods for s in pod_annotations(pod).get(names.ANN_SLOTS, "").split(",")
        }
        chosen = []
        for index in gpus:
            gpu = self._gpus[node][index]
            free = (slot_id(gpu.uuid, s) for s in range(names.SLOTS_PER_GPU))
            slot = next((s for s in free if s not in taken), None)
            if slot is None:
                raise InvalidRequest(f"node {node}: every device slot of GPU {index} is held")
            chosen.append(slot)
        return tuple(chosen)


def _one_waiting_per_size(pods: list[Pod], ask: GpuAsk, node: str, key: bytes) -> None:
    """Refuse a bind while another pod asking for as many GPUs waits for its Allocate here.

    The kubelet names no pod in GetPreferredAllocation or Allocate, and admits pods in its own
    order: with one waiting pod per GPU count, the allocation size tells which pod is admitted,
    so the kubelet is steered to that pod's slots (as HAMi and Volcano lock a node per bind).
    """
    for pod in pods:
        if placed(pod) and gpu_count(pod) == ask.gpus and waiting(pod, key):
            raise InvalidRequest(
                f"node {node}: pod {pod_key(pod)} ({ask.gpus} GPU(s)) waits for the kubelet to "
                "admit it; one such pod per node at a time, retry shortly"
            )
