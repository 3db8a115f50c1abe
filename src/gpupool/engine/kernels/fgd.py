"""Compiled FGD / gpupool integer kernels: scores, GPU choices and fragmentation cells of the changed nodes,
the dedup of nodes in identical states, gpupool's stranding term. Pure array code: imports no policy
(the FGD policy's ``fgd_compiled`` module calls them through the public names at the end)."""

from __future__ import annotations

import math

import numpy as np

from gpupool.engine.kernels.registry import jit as _jit

_MARGIN = 1e-7
"""How close to an integer (score points) a compiled score may come before NumPy's exact path decides; the
compiled and BLAS sums differ by about 1e-12 points."""


@_jit
def _fits(nodes, share, gpu_milli, need_mem, restricts, allowed, usable, gpu_free, healthy, gpu_model, mem_cap,
          mem_free, out):  # pragma: no cover - compiled
    """gpu_fit_matrix of ``nodes`` (``share``: node_share of each) into ``out`` (k, G) bool."""
    n_models = allowed.shape[0] - 1
    for i in range(nodes.shape[0]):
        n = nodes[i]
        milli = share[i]
        for g in range(usable.shape[1]):
            ok = True
            if gpu_milli > 0:
                ok = usable[n, g] >= milli
            else:
                ok = healthy[n, g] and gpu_free[n, g] >= milli
            if ok and restricts:
                m = gpu_model[n, g]
                ok = allowed[m if m >= 0 else n_models]
            if ok:
                if need_mem:
                    ok = mem_cap[n, g] > 0 and mem_free[n, g] >= need_mem
                else:
                    ok = mem_free[n, g] >= mem_cap[n, g] * milli // 1000
            out[i, g] = ok


@_jit
def _after_share_cells(free, milli, cpu_a, model, mem_a, use_mem, access, t_milli, t_num, t_cpu, t_mem, t_gpu,
                       out):  # pragma: no cover - compiled
    """FragModel.frag_after_share's (k, G, T) cells: GPU g of node i gives ``milli`` (never below 0)."""
    n_models = access.shape[0] - 1
    n_gpus = free.shape[1]
    for i in range(free.shape[0]):
        m = model[i]
        mi = m if m >= 0 else n_models
        total = 0
        for g in range(n_gpus):
            total += free[i, g]
        for t in range(t_milli.shape[0]):
            tm = t_milli[t]
            count = 0
            small = 0
            for g in range(n_gpus):
                if free[i, g] >= tm:
                    count += 1
                else:
                    small += free[i, g]
            serve = t_gpu[t] and access[mi, t] and cpu_a[i] >= t_cpu[t] and (not use_mem or mem_a[i] >= t_mem[t])
            for g in range(n_gpus):
                x = free[i, g]
                a = x - milli if x > milli else 0
                c = count - (1 if x >= tm else 0) + (1 if a >= tm else 0)
                s = small - (0 if x >= tm else x) + (0 if a >= tm else a)
                if serve and c >= t_num[t]:
                    out[i, g, t] = s
                else:
                    out[i, g, t] = total - (x - a)


@_jit
def _fgd_nodes(nodes, usable, gpu_free, healthy, gpu_model, mem_cap, mem_free_g, cpu_free, mem_free, node_model,
               replicas, slice_milli, before, cpu, mem, mode, gpu_milli, need_mem, num_gpu, slice_ask, restricts,
               allowed, prob, use_mem, access, t_milli, t_num, t_cpu, t_mem, t_gpu, u_milli, t_idx, use_mask, mask,
               scores, choice, cells, share_out, free_out):  # pragma: no cover - compiled
    """FGD's integer scores ``floor(100 * sigmoid((before - after) / 1000))`` of placing the request on each of
    ``nodes`` (read from the cluster's arrays; ``before``: the (n_nodes,) fragmentation now) and, for a
    fractional pod (``mode`` 1), the best GPU of each node; ``mode`` 0: no GPU, 2: whole GPUs / replicas (the
    lowest-index fitting GPUs, as :func:`gpupool.engine.filters.gpu_fit_matrix` tests them, give the node's
    share). Modes 0 and 2 also write the fragmentation cells after placement (``cells``, (k, n_shapes) int64, as
    :meth:`gpupool.frag.FragModel.frag` builds them) for NumPy's exact path; every mode writes each node's share
    (``share_out``, :func:`gpupool.engine.filters.node_share`) and free usable GPU share (``free_out``). The
    fragmentation after placement is summed here in order, which may differ from NumPy's BLAS product in the
    last bits: returns True when any score lies within ``_MARGIN`` of an integer (where such a difference could
    move the floor), and the caller then takes NumPy's exact path. With ``use_mask``, only nodes where the
    (n_nodes,) bool ``mask`` is True count for that, and in modes 1 and 2 only they are scored (the scores of
    the others are never read: they get 0, and no cells). ``u_milli``: the
    distinct shares of the shapes, ``t_idx``: each shape's index in it (GPUs are counted once per distinct
    share, not per shape)."""
    n_models = access.shape[0] - 1
    n_gpus = usable.shape[1]
    n_shapes = t_milli.shape[0]
    n_milli = u_milli.shape[0]
    count = np.empty(n_shapes, dtype=np.int64)
    small = np.empty(n_shapes, dtype=np.int64)
    u_count = np.empty(n_milli, dtype=np.int64)
    u_small = np.empty(n_milli, dtype=np.int64)
    row = np.empty(n_gpus, dtype=np.int64)
    fits = np.empty(n_gpus, dtype=np.bool_)
    unsure = False
    for i in range(nodes.shape[0]):
        n = nodes[i]
        read = not use_mask or mask[n]  # a score that may be read: its floor must be NumPy's
        m = node_model[n]
        mi = m if m >= 0 else n_models
        cpu_a = cpu_free[n] - cpu
        mem_a = mem_free[n] - mem
        milli = gpu_milli
        if num_gpu > 0 and slice_ask and replicas[n] > 1:
            milli = slice_milli[n]
        share_out[i] = milli
        total = 0
        for g in range(n_gpus):
            total += usable[n, g]
        free_out[i] = total
        if not read and mode != 0:  # never read: not scored (no cells either); a pod without GPUs fits most
            scores[i] = 0.0  # nodes and is mostly sent to NumPy's path, so its cells are written for every node
            choice[i] = 0
            continue
        if mode != 0:  # _fits of one node
            for g in range(n_gpus):
                if gpu_milli > 0:
                    ok = usable[n, g] >= milli
                else:
                    ok = healthy[n, g] and gpu_free[n, g] >= milli
                if ok and restricts:
                    gm = gpu_model[n, g]
                    ok = allowed[gm if gm >= 0 else n_models]
                if ok:
                    if need_mem:
                        ok = mem_cap[n, g] > 0 and mem_free_g[n, g] >= need_mem
                    else:
                        ok = mem_free_g[n, g] >= mem_cap[n, g] * milli // 1000
                fits[g] = ok
        if mode == 1:
            for d in range(n_milli):
                c = 0
                sm = 0
                for g in range(n_gpus):
                    x = np.int64(usable[n, g])
                    if x >= u_milli[d]:
                        c += 1
                    else:
                        sm += x
                u_count[d] = c
                u_small[d] = sm
            for t in range(n_shapes):
                count[t] = u_count[t_idx[t]]
                small[t] = u_small[t_idx[t]]
            best = -np.inf
            best_g = 0
            for g in range(n_gpus):
                if not fits[g]:
                    continue
                x = np.int64(usable[n, g])
                a = x - gpu_milli if x > gpu_milli else 0
                after = 0.0
                for t in range(n_shapes):
                    tm = t_milli[t]
                    cell = total - (x - a)
                    if t_gpu[t] and access[mi, t] and cpu_a >= t_cpu[t] and (not use_mem or mem_a >= t_mem[t]):
                        c = count[t] - (1 if x >= tm else 0) + (1 if a >= tm else 0)
                        if c >= t_num[t]:
                            cell = small[t] - (0 if x >= tm else x) + (0 if a >= tm else a)
                    after += cell * prob[t]
                v = 100.0 / (1.0 + math.exp(-(before[n] - after) / 1000.0))
                f = math.floor(v)
                if read and (v - f < _MARGIN or f + 1.0 - v < _MARGIN):
                    unsure = True
                if f > best:
                    best = f
                    best_g = g
            scores[i] = best
            choice[i] = best_g
            continue
        taken = 0
        after_total = 0
        for g in range(n_gpus):
            x = np.int64(usable[n, g])
            if mode == 2 and fits[g] and taken < num_gpu:
                taken += 1
                x -= milli
            row[g] = x
            after_total += x
        for d in range(n_milli):
            c = 0
            sm = 0
            for g in range(n_gpus):
                if row[g] >= u_milli[d]:
                    c += 1
                else:
                    sm += row[g]
            u_count[d] = c
            u_small[d] = sm
        after = 0.0
        terms = 0
        for t in range(n_shapes):
            cell = after_total
            if t_gpu[t] and access[mi, t] and cpu_a >= t_cpu[t] and (not use_mem or mem_a >= t_mem[t]):
                if u_count[t_idx[t]] >= t_num[t]:
                    cell = u_small[t_idx[t]]
            cells[i, t] = cell
            if cell != 0:
                terms += 1
            after += cell * prob[t]
        v = 100.0 / (1.0 + math.exp(-(before[n] - after) / 1000.0))
        f = math.floor(v)
        # Sure when the decrease is exactly NumPy's and exactly 0: a sum of at most one nonzero product is the
        # same bits in any order (BLAS's too), and a zero decrease scores 100 / (1 + exp(0)) = 50.0 exactly in
        # any exp. That is where whole-GPU pods that fragment nothing land: on the floor's boundary.
        if read and (v - f < _MARGIN or f + 1.0 - v < _MARGIN) and not (terms <= 1 and before[n] - after == 0.0):
            unsure = True
        scores[i] = f
        choice[i] = 0
    return unsure


@_jit
def _before_cells(nodes, before_at, version, usable, cpu_free, node_model, mem_free, use_mem, access, t_milli, t_num,
                  t_cpu, t_mem, t_gpu, u_milli, t_idx, pos, out):  # pragma: no cover - compiled
    """The nodes among ``nodes`` whose fragmentation ``before_at`` is not their ``version``: their positions in
    ``nodes`` (``pos``, in order) and the fragmentation cells of their current state (``out[j]`` for ``pos[j]``:
    what :meth:`FragModel.frag` multiplies with the shape probabilities), read from the cluster's arrays;
    returns how many."""
    n_models = access.shape[0] - 1
    n_gpus = usable.shape[1]
    n_milli = u_milli.shape[0]
    u_count = np.empty(n_milli, dtype=np.int64)
    u_small = np.empty(n_milli, dtype=np.int64)
    k = 0
    for j in range(nodes.shape[0]):
        n = nodes[j]
        if before_at[n] == version[n]:
            continue
        pos[k] = j
        i = k
        k += 1
        total = 0
        for g in range(n_gpus):
            total += usable[n, g]
        m = node_model[n]
        mi = m if m >= 0 else n_models
        cpu = cpu_free[n]
        mem = mem_free[n]
        for d in range(n_milli):  # GPUs with at least each distinct share free, and the free share of the others
            c = 0
            sm = 0
            for g in range(n_gpus):
                x = np.int64(usable[n, g])
                if x >= u_milli[d]:
                    c += 1
                else:
                    sm += x
            u_count[d] = c
            u_small[d] = sm
        for t in range(t_milli.shape[0]):
            cell = total
            if t_gpu[t] and access[mi, t] and cpu >= t_cpu[t] and (not use_mem or mem >= t_mem[t]):
                if u_count[t_idx[t]] >= t_num[t]:
                    cell = u_small[t_idx[t]]
            out[i, t] = cell
    return k


@_jit
def _same_key(a, b, node_model, cpu_free, mem_free, gpu_free, healthy, mem_free_g, mem_cap,
              slice_milli):  # pragma: no cover - compiled
    """Whether nodes ``a`` and ``b`` have the same FGD._evaluate_dedup key row."""
    if node_model[a] != node_model[b] or cpu_free[a] != cpu_free[b] or mem_free[a] != mem_free[b]:
        return False
    if slice_milli[a] != slice_milli[b]:
        return False
    for g in range(gpu_free.shape[1]):
        if (gpu_free[a, g] != gpu_free[b, g] or healthy[a, g] != healthy[b, g] or mem_free_g[a, g] != mem_free_g[b, g]
                or mem_cap[a, g] != mem_cap[b, g]):
            return False
    return True


@_jit
def _stable_argsort(h):  # pragma: no cover - compiled
    """``np.argsort(h, kind="stable")`` of a (k,) uint64 array: least-significant-digit radix sort, 8 bits a
    pass (a pass whose byte is the same in every key is skipped), stable, so the same permutation."""
    k = h.shape[0]
    if k < 64:
        return np.argsort(h, kind="mergesort")
    order = np.arange(k)
    tmp = np.empty(k, dtype=np.int64)
    count = np.empty(257, dtype=np.int64)
    for shift in range(0, 64, 8):
        count[:] = 0
        for i in range(k):
            count[((h[i] >> np.uint64(shift)) & np.uint64(255)) + 1] += 1
        if count[1:].max() == k:  # every key has this byte: the pass keeps the order
            continue
        for b in range(256):
            count[b + 1] += count[b]
        for r in range(k):
            i = order[r]
            b = (h[i] >> np.uint64(shift)) & np.uint64(255)
            tmp[count[b]] = i
            count[b] += 1
        order, tmp = tmp, order
    return order


@_jit
def _distinct_nodes(nodes, weights, node_model, cpu_free, mem_free, gpu_free, healthy, mem_free_g, mem_cap,
                    slice_milli, first_out, inverse):  # pragma: no cover - compiled
    """fgd._distinct_rows of FGD._evaluate_dedup's key over ``nodes``, read from the state arrays: the same
    hashes (wrapping uint64 dot product of the key row with ``weights``), ``first`` (returns how many) in
    sorted-hash order with each hash's first row, ``inverse``; returns -1 on a hash collision (the caller then
    takes the policy's own path)."""
    k = nodes.shape[0]
    n_gpus = gpu_free.shape[1]
    h = np.empty(k, dtype=np.uint64)
    # the key row: model, CPU, memory, per GPU free share / health / free memory / memory size, replica share
    for i in range(k):  # (weights in that column order; the sum wraps, so the order of the terms does not matter)
        n = nodes[i]
        acc = (np.uint64(np.int64(node_model[n])) * weights[0] + np.uint64(np.int64(cpu_free[n])) * weights[1]
               + np.uint64(np.int64(mem_free[n])) * weights[2]
               + np.uint64(np.int64(slice_milli[n])) * weights[3 + 4 * n_gpus])
        for g in range(n_gpus):
            acc += (np.uint64(np.int64(gpu_free[n, g])) * weights[3 + g]
                    + np.uint64(np.int64(1 if healthy[n, g] else 0)) * weights[3 + n_gpus + g]
                    + np.uint64(np.int64(mem_free_g[n, g])) * weights[3 + 2 * n_gpus + g]
                    + np.uint64(np.int64(mem_cap[n, g])) * weights[3 + 3 * n_gpus + g])
        h[i] = acc
    order = _stable_argsort(h)  # stable: equal hashes keep row order, so the first is the first row
    n_first = 0
    for r in range(k):
        i = order[r]
        if r == 0 or h[i] != h[order[r - 1]]:
            first_out[n_first] = i
            n_first += 1
        inverse[i] = n_first - 1
    for i in range(k):  # a collision: two different rows with one hash (a first row is its own representative)
        rep = first_out[inverse[i]]
        if rep != i and not _same_key(nodes[i], nodes[rep], node_model, cpu_free, mem_free, gpu_free, healthy,
                                      mem_free_g, mem_cap, slice_milli):
            return -1
    return n_first


@_jit
def _strand_delta(nodes, gpu_free, demand, cpu_free, mem_free, req_cpu, req_mem, cpu_ratio, mem_ratio,
                  out):  # pragma: no cover - compiled
    """out[i] = GPUs of free share node ``nodes[i]`` strands after the placement minus before
    (:func:`gpupool.policies.gpupool_policy.stranded_gpus`, the same float operations in the same order: the
    feedable share is the smaller of free CPU / ``cpu_ratio`` and free memory / ``mem_ratio``, a ratio of 0
    leaving its resource out). ``gpu_free``, ``demand``: (k,) milli-GPU free before and taken by the pod.
    Returns whether any entry is nonzero."""
    nonzero = False
    for i in range(len(nodes)):
        n = nodes[i]
        fb = np.inf
        fa = np.inf
        if cpu_ratio > 0:
            fb = min(fb, cpu_free[n] / cpu_ratio)
            fa = min(fa, (cpu_free[n] - req_cpu) / cpu_ratio)
        if mem_ratio > 0:
            fb = min(fb, mem_free[n] / mem_ratio)
            fa = min(fa, (mem_free[n] - req_mem) / mem_ratio)
        before = max(0.0, gpu_free[i] - fb) / 1000
        after = max(0.0, (gpu_free[i] - demand[i]) - fa) / 1000
        out[i] = after - before
        if out[i] != 0.0:
            nonzero = True
    return nonzero


# public names of the kernels the FGD policy's fgd_compiled module calls, read from this module at each call:
# :func:`gpupool.engine.kernels.enabled` rebinds them with the kernels' own names
fits = _fits
after_share_cells = _after_share_cells
fgd_nodes = _fgd_nodes
before_cells = _before_cells
distinct_nodes_kernel = _distinct_nodes
strand_delta = _strand_delta
