"""Tests of gpupool.traces: small good and malformed files, then the real public traces."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import pytest

from gpupool.model import GpupoolError, NodeSpec, PodRequest
from gpupool.traces import (
    JobRecord,
    TraceFormatError,
    detect_job_format,
    load_itp_jobs,
    load_jobs,
    load_openb_nodes,
    load_openb_pods,
    load_philly_jobs,
)

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
POD5_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"
ITP_HEADER = "job_id,submission_time,duration,num_gpu"


def write(tmp_path: Path, name: str, *lines: str, final_newline: bool = True) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""), encoding="utf-8")
    return path


def expect_error(loader, path: Path, line: int, column: str | None) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        loader(path)
    err = info.value
    assert err.path == path
    assert (err.line, err.column) == (line, column), str(err)
    assert str(err).startswith(f"{path.name}:{line}: ")
    if column is not None:
        assert f"column {column!r}: " in str(err)
    return err


# ------------------------------------------------------------------------------------------ errors


def test_error_type_and_message() -> None:
    err = TraceFormatError(
        Path("/x/openb_pod_list_default.csv"), 12, "gpu_milli", "expected an integer, got 'abc'"
    )
    assert isinstance(err, GpupoolError) and isinstance(err, ValueError)
    assert str(err) == "openb_pod_list_default.csv:12: column 'gpu_milli': expected an integer, got 'abc'"
    assert err.path == Path("/x/openb_pod_list_default.csv")
    assert (err.line, err.column, err.message) == (12, "gpu_milli", "expected an integer, got 'abc'")
    assert str(TraceFormatError("a.csv", 1, None, "empty file")) == "a.csv:1: empty file"
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.line, back.column) == (str(err), 12, "gpu_milli")


def test_integer_error_message(tmp_path: Path) -> None:
    path = write(tmp_path, "openb_pod_list_default.csv", POD5_HEADER, "p0,1000,1024,1,abc")
    err = expect_error(load_openb_pods, path, 2, "gpu_milli")
    assert str(err) == "openb_pod_list_default.csv:2: column 'gpu_milli': expected an integer, got 'abc'"


# ------------------------------------------------------------------------------------------- nodes


def test_nodes_good(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "nodes.csv",
        NODE_HEADER,
        "openb-node-0000,32000,262144,0,",
        "openb-node-0001,96000,786432,8,V100M16",
    )
    assert load_openb_nodes(path) == [
        NodeSpec("openb-node-0000", 32000, 262144, 0, ""),
        NodeSpec("openb-node-0001", 96000, 786432, 8, "V100M16"),
    ]


def test_nodes_str_path_and_column_order(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes.csv", "model,gpu,sn,memory_mib,cpu_milli", "T4,1,n1,1024,8000")
    assert load_openb_nodes(str(path)) == [NodeSpec("n1", 8000, 1024, 1, "T4")]


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("n1,32000,262144,2,", "model"),  # GPUs without a model
        ("n1,32000,262144,-1,", "gpu"),  # negative
        ("n1,32k,262144,0,", "cpu_milli"),  # non-numeric
        ("n1,32000,1.5,0,", "memory_mib"),  # not an integer
        ("n1,32000,,0,", "memory_mib"),  # empty
        (",32000,262144,0,", "sn"),  # no name
        ("n1,32000,262144,0", None),  # too few fields
        ("n1,32000,262144,0,,", None),  # too many fields
        ("   ", None),  # a blank-looking line that is not empty
    ],
)
def test_nodes_malformed(tmp_path: Path, row: str, column: str | None) -> None:
    path = write(tmp_path, "nodes.csv", NODE_HEADER, "n0,32000,262144,0,", row)
    expect_error(load_openb_nodes, path, 3, column)


def test_nodes_duplicate_name(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes.csv", NODE_HEADER, "n0,1,1,0,", "n1,1,1,0,", "n0,1,1,0,")
    err = expect_error(load_openb_nodes, path, 4, "sn")
    assert "line 2" in err.message


@pytest.mark.parametrize(
    ("header", "column"),
    [
        ("sn,cpu_milli,memory_mib,gpu", "model"),  # missing
        ("sn,cpu_milli,memory_mib,gpu,model,rack", "rack"),  # unknown
        ("sn,cpu_milli,memory_mib,gpu,gpu,model", "gpu"),  # duplicate
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli", "name"),  # a pod list, not a node list
    ],
)
def test_nodes_bad_header(tmp_path: Path, header: str, column: str) -> None:
    path = write(tmp_path, "nodes.csv", header, "n0,1,1,0,")
    expect_error(load_openb_nodes, path, 1, column)


def test_empty_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    for loader in (load_openb_nodes, load_openb_pods, load_philly_jobs, load_itp_jobs, load_jobs):
        expect_error(loader, empty, 1, None)
    blank_header = write(tmp_path, "blank.csv", "", NODE_HEADER)
    expect_error(load_openb_nodes, blank_header, 1, None)


def test_header_only_is_empty_list(tmp_path: Path) -> None:
    assert load_openb_nodes(write(tmp_path, "n.csv", NODE_HEADER)) == []
    assert load_openb_pods(write(tmp_path, "p.csv", POD_HEADER)) == []
    assert load_philly_jobs(write(tmp_path, "ph.csv", PHILLY_HEADER)) == []
    assert load_itp_jobs(write(tmp_path, "i.csv", ITP_HEADER, final_newline=False)) == []


def test_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_bytes(("\ufeff" + NODE_HEADER + "\r\nn0,1000,2048,1,T4\r\n").encode("utf-8"))
    assert load_openb_nodes(path) == [NodeSpec("n0", 1000, 2048, 1, "T4")]


def test_csv_syntax_and_encoding_errors(tmp_path: Path) -> None:
    quote = write(tmp_path, "q.csv", NODE_HEADER, "n0,1,1,0,", 'n1,1,1,0,"T4')
    expect_error(load_openb_nodes, quote, 3, None)
    latin = tmp_path / "l.csv"
    latin.write_bytes((NODE_HEADER + "\nn0,1,1,0,\nn\xe9,1,1,0,\n").encode("latin-1"))
    expect_error(load_openb_nodes, latin, 3, None)


def test_line_numbers_count_blank_and_multiline_records(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes.csv", NODE_HEADER, "", '"n\n0",1,1,0,', "", "n1,x,1,0,")
    err = expect_error(load_openb_nodes, path, 6, "cpu_milli")
    assert err.path == path


# -------------------------------------------------------------------------------------------- pods


def test_pods_good_11_columns(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        POD_HEADER,
        "p0,12000,16384,1,1000,,LS,Running,0,12537496,0",
        "p1,6000,12288,1,460,V100M16|V100M32,BE,Pending,427061.5,,",
        "p2,4000,8192,0,0,,Burstable,Failed,500,600,501",
        "p3,4000,8192,8,1000,T4,Guaranteed,Succeeded,700,800,700",
        "p4,1000,1024,2,1000,,,Running,,,",
    )
    pods = load_openb_pods(path)
    assert [p.name for p in pods] == ["p0", "p1", "p2", "p3", "p4"]
    assert pods[0] == PodRequest(
        "p0", 12000, 16384, 1, 1000, (), qos="LS", priority=2, creation_time=0.0, deletion_time=12537496.0
    )
    assert pods[1].gpu_spec == ("V100M16", "V100M32")
    assert (pods[1].qos, pods[1].priority, pods[1].is_fractional) == ("BE", 0, True)
    assert (pods[1].creation_time, pods[1].deletion_time) == (427061.5, None)
    assert (pods[2].qos, pods[2].priority, pods[2].is_gpu) == ("Burstable", 1, False)
    assert (pods[3].priority, pods[3].gpu_spec, pods[3].total_gpu_milli) == (2, ("T4",), 8000)
    assert (pods[4].qos, pods[4].priority) == ("", 0)
    assert (pods[4].creation_time, pods[4].deletion_time) == (None, None)
    assert isinstance(pods[0].creation_time, float)


def test_pods_good_5_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "multigpu.csv", POD5_HEADER, "p0,12000,16384,1,1000", "p1,16200,66560,2,1000")
    pods = load_openb_pods(path)
    assert pods == [PodRequest("p0", 12000, 16384, 1, 1000), PodRequest("p1", 16200, 66560, 2, 1000)]
    assert all(p.qos == "" and p.priority == 0 and p.creation_time is None for p in pods)


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("p1,6000,12288,1,abc,,LS,Running,1,2,1", "gpu_milli"),  # non-numeric
        ("p1,6000,12288,1,1001,,LS,Running,1,2,1", "gpu_milli"),  # InvalidRequestError: > 1000
        ("p1,6000,12288,1,0,,LS,Running,1,2,1", "gpu_milli"),  # InvalidRequestError: GPU without share
        ("p1,6000,12288,0,500,,LS,Running,1,2,1", "gpu_milli"),  # InvalidRequestError: share without GPU
        ("p1,6000,12288,2,500,,LS,Running,1,2,1", "num_gpu"),  # InvalidRequestError: fractional x 2
        ("p1,-6000,12288,1,500,,LS,Running,1,2,1", "cpu_milli"),  # negative
        ("p1,6000,12288,-1,1000,,LS,Running,1,2,1", "num_gpu"),  # negative
        ("p1,6000,12288,1,500,,LS,Running,-1,2,1", "creation_time"),  # negative time
        ("p1,6000,12288,1,500,,LS,Running,1,soon,1", "deletion_time"),  # non-numeric time
        ("p1,6000,12288,1,500,,LS,Running,5,2,1", "deletion_time"),  # deleted before created
        ("p1,6000,12288,1,500,,LS,Running,1,2,x", "scheduled_time"),  # non-numeric time
        ("p1,6000,12288,1,500,,LS,Running,nan,2,1", "creation_time"),  # not a finite number
        ("p1,6000,12288,1,500,T4|,LS,Running,1,2,1", "gpu_spec"),  # empty model in spec
        ("p1,6000,12288,1,500,,Gold,Running,1,2,1", "qos"),  # unknown QoS
        ("p0,6000,12288,1,500,,LS,Running,1,2,1", "name"),  # duplicate name
        (",6000,12288,1,500,,LS,Running,1,2,1", "name"),  # empty name
        ("p1,6000,12288,1,500,,LS,Running,1,2", None),  # 10 fields
    ],
)
def test_pods_malformed(tmp_path: Path, row: str, column: str | None) -> None:
    path = write(tmp_path, "pods.csv", POD_HEADER, "p0,1000,1024,0,0,,BE,Running,0,1,0", row)
    expect_error(load_openb_pods, path, 3, column)


def test_pods_invalid_request_message_kept(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", POD5_HEADER, "p0,1,1,0,500")
    err = expect_error(load_openb_pods, path, 2, "gpu_milli")
    assert "without num_gpu" in err.message


@pytest.mark.parametrize(
    ("header", "column"),
    [
        ("name,cpu_milli,memory_mib,num_gpu", "gpu_milli"),
        (POD5_HEADER + ",priority", "priority"),
    ],
)
def test_pods_bad_header(tmp_path: Path, header: str, column: str) -> None:
    path = write(tmp_path, "pods.csv", header, "p0,1,1,0,0")
    expect_error(load_openb_pods, path, 1, column)


# ------------------------------------------------------------------------------------------ philly


def test_philly_good(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "philly.csv",
        PHILLY_HEADER,
        "2017-10-09 07:01:55,66.0,1,66.0,11cb48",
        "2017-10-09 06:13:03,2951.0,2,5902.0,6214e9",
        "2017-10-09 07:01:55,10.5,4,42.0,6214e9",
        "2017-10-10 06:13:03,1.0,1,1.0000000001,11cb48",
        "",  # the real file ends with an empty line
    )
    jobs = load_philly_jobs(path)
    assert jobs == [
        JobRecord("philly-3", 0.0, 2951.0, 2, "6214e9", 3),
        JobRecord("philly-2", 2932.0, 66.0, 1, "11cb48", 2),
        JobRecord("philly-4", 2932.0, 10.5, 4, "6214e9", 4),  # same second: file order kept
        JobRecord("philly-5", 86400.0, 1.0, 1, "11cb48", 5),
    ]
    assert load_jobs(path) == jobs
    assert load_jobs(path, "philly") == jobs
    assert detect_job_format(path) == "philly"


def test_job_record_is_frozen() -> None:
    job = JobRecord("j", 0.0, 1.0, 1, "", 2)
    with pytest.raises(AttributeError):
        job.num_gpu = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("2017-10-09T07:01:55,66.0,1,66.0,a", "timestamp"),  # wrong format
        ("2017-13-09 07:01:55,66.0,1,66.0,a", "timestamp"),  # no 13th month
        ("2017-10-09 07:01:55,abc,1,66.0,a", "duration"),
        ("2017-10-09 07:01:55,0.0,1,0.0,a", "duration"),  # zero
        ("2017-10-09 07:01:55,-5.0,1,-5.0,a", "duration"),  # negative
        ("2017-10-09 07:01:55,66.0,0,0.0,a", "num_gpus"),  # < 1
        ("2017-10-09 07:01:55,66.0,1.5,99.0,a", "num_gpus"),  # not an integer
        ("2017-10-09 07:01:55,66.0,2,66.0,a", "gpu_time"),  # != duration * num_gpus
        ("2017-10-09 07:01:55,66.0,1,66.001,a", "gpu_time"),  # off by more than 1e-6 relative
        ("2017-10-09 07:01:55,66.0,1,66.0,", "cluster"),  # no VC
        ("2017-10-09 07:01:55,66.0,1,66.0", None),  # 4 fields
        (",,,,", "timestamp"),  # a row of empty fields is not a blank line
    ],
)
def test_philly_malformed(tmp_path: Path, row: str, column: str | None) -> None:
    path = write(tmp_path, "philly.csv", PHILLY_HEADER, "2017-10-09 07:01:55,66.0,1,66.0,a", "", row, "")
    expect_error(load_philly_jobs, path, 4, column)


def test_philly_bad_header(tmp_path: Path) -> None:
    path = write(tmp_path, "philly.csv", "timestamp,duration,num_gpus,cluster", "2017-10-09 07:01:55,1,1,a")
    expect_error(load_philly_jobs, path, 1, "gpu_time")


# --------------------------------------------------------------------------------------------- itp


def test_itp_good(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "cluster01.csv",
        ITP_HEADER,
        "a,1932025,2429,64",
        "b,2000581,1532,1",
        "c,1900000,600,8",
        "d,1932025,700.5,2",
        final_newline=False,
    )
    jobs = load_itp_jobs(path)
    assert jobs == [
        JobRecord("c", 0.0, 600.0, 8, "", 4),
        JobRecord("a", 32025.0, 2429.0, 64, "", 2),
        JobRecord("d", 32025.0, 700.5, 2, "", 5),
        JobRecord("b", 100581.0, 1532.0, 1, "", 3),
    ]
    assert load_jobs(path) == jobs
    assert load_jobs(path, "itp") == jobs
    assert detect_job_format(path) == "itp"


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("b,x,600,1", "submission_time"),
        ("b,-1,600,1", "submission_time"),
        ("b,1e300,600,1", "submission_time"),  # above MAX_SUBMISSION_TIME_S: every duration would round away
        ("b,10,0,1", "duration"),
        ("b,10,-600,1", "duration"),
        ("b,10,1e12,1", "duration"),  # above MAX_JOB_DURATION_S: a unit mistake
        ("b,10,600,0", "num_gpu"),
        ("b,10,600,-2", "num_gpu"),
        ("b,10,600,one", "num_gpu"),
        ("a,10,600,1", "job_id"),  # duplicate id
        (",10,600,1", "job_id"),  # empty id
        ("b,10,600", None),
        ("b,10,600,1,1", None),
    ],
)
def test_itp_malformed(tmp_path: Path, row: str, column: str | None) -> None:
    path = write(tmp_path, "cluster01.csv", ITP_HEADER, "a,0,600,1", row, final_newline=False)
    expect_error(load_itp_jobs, path, 3, column)


def test_detect_and_dispatch_errors(tmp_path: Path) -> None:
    pods = write(tmp_path, "pods.csv", POD5_HEADER, "p0,1,1,0,0")
    expect_error(detect_job_format, pods, 1, None)
    expect_error(load_jobs, pods, 1, None)
    itp = write(tmp_path, "itp.csv", ITP_HEADER, "a,0,600,1")
    with pytest.raises(ValueError, match="unknown job trace format"):
        load_jobs(itp, "helios")
    # Forcing the wrong format reports the header.
    expect_error(lambda p: load_jobs(p, "philly"), itp, 1, "job_id")
    # Column order does not matter for detection.
    shuffled = write(tmp_path, "shuffled.csv", "num_gpu,duration,submission_time,job_id", "1,600,0,a")
    assert detect_job_format(shuffled) == "itp"
    assert load_jobs(shuffled) == [JobRecord("a", 0.0, 600.0, 1, "", 2)]


# ---------------------------------------------------------------------------------- the real traces


def real(relative: str) -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"public traces not found at {TRACES}")
    path = TRACES / relative
    assert path.is_file(), path
    return path


def test_real_openb_nodes() -> None:
    gpu_nodes = load_openb_nodes(real("openb/openb_node_list_gpu_node.csv"))
    assert len(gpu_nodes) == 1213
    assert sum(n.gpu_count for n in gpu_nodes) == 6212
    assert sum(n.cpu_milli for n in gpu_nodes) == 107_018_000
    by_model = Counter(n.gpu_model for n in gpu_nodes)
    assert by_model == {"G2": 549, "T4": 404, "P100": 134, "V100M16": 55, "G3": 39, "V100M32": 30, "A10": 2}
    all_nodes = load_openb_nodes(real("openb/openb_node_list_all_node.csv"))
    assert len(all_nodes) == 1523
    assert sum(1 for n in all_nodes if n.gpu_count == 0 and n.gpu_model == "") == 310


def test_real_openb_default_pods() -> None:
    pods = load_openb_pods(real("openb/openb_pod_list_default.csv"))
    assert len(pods) == 8152
    assert pods[0].name == "openb-pod-0000"
    num_gpu = Counter(p.num_gpu for p in pods)
    assert num_gpu == {0: 1088, 1: 6989, 2: 16, 4: 15, 8: 44}
    assert sum(1 for p in pods if p.is_fractional) == 3078
    assert Counter(p.qos for p in pods) == {"LS": 4647, "BE": 3398, "Burstable": 100, "Guaranteed": 7}
    assert all(p.gpu_spec == () for p in pods)
    assert round(sum(p.total_gpu_milli for p in pods) / 1000) == 6087
    creation = [p.creation_time for p in pods]
    assert creation == sorted(creation) and creation[0] == 0.0  # the file is sorted by creation_time


def test_real_openb_pod_variants() -> None:
    spec33 = load_openb_pods(real("openb/openb_pod_list_gpuspec33.csv"))
    assert len(spec33) == 8152
    assert sum(1 for p in spec33 if p.gpu_spec) == 2388
    assert Counter(p.gpu_spec for p in spec33)[("V100M16", "V100M32")] == 141
    share = load_openb_pods(real("openb/openb_pod_list_gpushare100.csv"))
    assert Counter(p.num_gpu for p in share) == {0: 1088, 1: 7064}
    assert all(p.is_fractional for p in share if p.is_gpu)
    multi = load_openb_pods(real("openb/openb_pod_list_multigpu50.csv"))
    assert len(multi) == 9061
    assert Counter(p.num_gpu for p in multi) == {0: 1088, 1: 6989, 2: 222, 4: 206, 8: 556}
    assert all(p.qos == "" and p.priority == 0 and p.creation_time is None for p in multi)


def test_real_philly() -> None:
    path = real("philly_pollux/philly.csv")
    assert detect_job_format(path) == "philly"
    jobs = load_jobs(path)
    assert len(jobs) == 82247
    queues = Counter(j.queue for j in jobs)
    assert len(queues) == 15
    assert (queues["6214e9"], queues["11cb48"], queues["795a4c"]) == (41226, 16091, 3)
    assert Counter(j.num_gpu for j in jobs)[128] == 3
    assert jobs[0].submit_time == 0.0
    assert all(a.submit_time <= b.submit_time for a, b in zip(jobs, jobs[1:], strict=False))
    # 2017-09-04 10:30:41 ... 2017-12-22 08:02:11
    assert jobs[-1].submit_time == 9_408_690.0
    assert round(sum(j.duration * j.num_gpu for j in jobs) / 3600) == 978_078
    assert len({j.job_id for j in jobs}) == len(jobs)


ITP_JOBS = {
    "cluster01.csv": 1595,
    "cluster02.csv": 5778,
    "cluster03.csv": 3011,
    "cluster04.csv": 15802,
    "cluster05.csv": 3629,
    "cluster06.csv": 2396,
    "cluster07.csv": 12699,
    "cluster08.csv": 13047,
    "cluster09.csv": 11134,
    "cluster10.csv": 260,
}


def test_real_itp_clusters() -> None:
    total = 0
    gpu_seconds = 0.0
    for name, count in ITP_JOBS.items():
        path = real(f"msr_itp_elasticflow/{name}")
        assert detect_job_format(path) == "itp"
        jobs = load_jobs(path)
        assert len(jobs) == count, name
        assert jobs[0].submit_time == 0.0
        assert all(a.submit_time <= b.submit_time for a, b in zip(jobs, jobs[1:], strict=False))
        assert min(j.duration for j in jobs) >= 600
        assert all(j.queue == "" for j in jobs)
        total += len(jobs)
        gpu_seconds += sum(j.duration * j.num_gpu for j in jobs)
    assert total == 69351
    assert round(gpu_seconds / 3600) == 1_632_720
