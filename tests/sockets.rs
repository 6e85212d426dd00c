//! Held listening sockets (`tend::sockets`) and how a spawned service gets
//! them (`tend::process::spawn` with `sockets`): fds 3.., LISTEN_FDS,
//! LISTEN_FDNAMES, LISTEN_PID. Each test that binds runs alone in a fresh
//! process (see common/alone.rs), since the sockets take over fds 3...

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use common::alone::alone;
use common::{secs, wait_for};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tend::process::spawn::{self, Fds, Output, Sockets, SpawnError, Spec};
use tend::sockets::{self, Held, Listen, SocketSpec};

/// Writes what the process sees (its pid, its open fds among 0..64, the
/// socket activation variables) to argv[1] as JSON, then accepts one
/// connection on each passed socket and answers "<i> from <pid>".
const REPORT: &str = r#"
import json, os, socket, sys
fds = []
for fd in range(64):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
env = {k: os.environ.get(k) for k in
       ("LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID", "NOTIFY_SOCKET", "FROM_SERVICE_ENV")}
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "fds": fds, "env": env}, f)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
for i in range(int(os.environ.get("LISTEN_FDS", "0"))):
    listener = socket.socket(fileno=3 + i)
    listener.settimeout(20)
    conn, _ = listener.accept()
    conn.sendall(f"{i} from {os.getpid()}".encode())
    conn.close()
"#;

fn tcp(name: &str, addr: &str) -> SocketSpec {
    SocketSpec {
        service: 0,
        name: name.into(),
        listen: addr.parse().unwrap(),
        backlog: None,
        mode: None,
    }
}

fn unix(name: &str, path: &Path, mode: Option<u32>) -> SocketSpec {
    SocketSpec {
        service: 0,
        name: name.into(),
        listen: Listen::Unix(path.to_path_buf()),
        backlog: None,
        mode,
    }
}

/// Starts `argv` as tend starts the service.
fn start(argv: &[String], env: &BTreeMap<String, String>, sockets: Option<&Held>) -> Pid {
    start_with(argv, env, sockets, Fds::Inherited)
}

fn start_with(
    argv: &[String],
    env: &BTreeMap<String, String>,
    sockets: Option<&Held>,
    fds: Fds,
) -> Pid {
    let all: Vec<usize> = (0..sockets.map_or(0, Held::count)).collect();
    start_some(
        argv,
        env,
        sockets.map(|held| Sockets { held, which: &all }),
        fds,
    )
}

/// Starts `argv` with `sockets` (some of the held ones, in some order).
fn start_some(
    argv: &[String],
    env: &BTreeMap<String, String>,
    sockets: Option<Sockets<'_>>,
    fds: Fds,
) -> Pid {
    spawn::spawn(Spec {
        argv,
        env,
        working_dir: None,
        take_terminal: false,
        output: Output::Inherit,
        sockets,
        extra_env: &[("NOTIFY_SOCKET".into(), "/run/test-notify".into())],
        stdin_null: false,
        user: None,
        fds,
    })
    .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"))
}

fn reporter(report: &Path) -> Vec<String> {
    vec![
        "python3".into(),
        "-c".into(),
        REPORT.into(),
        report.display().to_string(),
    ]
}

fn read_report(report: &Path) -> serde_json::Value {
    wait_for("the child's report", secs(20.0), || {
        serde_json::from_slice(&fs::read(report).ok()?).ok()
    })
}

/// Waits (bounded) for `pid` to exit and returns its exit code.
fn exit_code(pid: Pid) -> i32 {
    wait_for(&format!("pid {pid} to exit"), secs(20.0), || match waitpid(
        pid,
        Some(WaitPidFlag::WNOHANG),
    )
    .unwrap()
    {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::StillAlive => None,
        other => panic!("pid {pid}: {other:?}"),
    })
}

fn fds(report: &serde_json::Value) -> Vec<i64> {
    report["fds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

fn tcp_port(held: &Held, i: usize) -> SocketAddr {
    match held.local_addr(i).unwrap() {
        Listen::Tcp(addr) => addr,
        other => panic!("socket {i} is {other}"),
    }
}

fn is_socket(fd: RawFd) -> bool {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    unsafe { libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFSOCK }
}

fn is_open(fd: RawFd) -> bool {
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

fn ask(stream: &mut impl std::io::Read) -> String {
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

#[test]
fn the_service_gets_the_sockets_as_fds_3_and_up_with_listen_variables() {
    alone(
        "the_service_gets_the_sockets_as_fds_3_and_up_with_listen_variables",
        || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("run/admin.sock");
            let held = sockets::bind_all(&[tcp("http", "127.0.0.1:0"), unix("admin", &path, None)])
                .unwrap();
            assert_eq!(held.count(), 2);
            assert_eq!(held.names(&[0, 1]), "http:admin");
            assert!(
                is_socket(3) && is_socket(4),
                "the sockets are at fds 3 and 4"
            );
            assert_eq!(held.local_addr(1).unwrap(), Listen::Unix(path.clone()));
            let http = tcp_port(&held, 0);
            assert_ne!(http.port(), 0, "the kernel's port is reported");

            let report = dir.path().join("report.json");
            let env = BTreeMap::from([("FROM_SERVICE_ENV".to_string(), "yes".to_string())]);
            let pid = start(&reporter(&report), &env, Some(&held));
            let seen = read_report(&report);
            assert_eq!(seen["pid"], pid.as_raw());
            assert_eq!(seen["env"]["LISTEN_PID"], pid.as_raw().to_string());
            assert_eq!(seen["env"]["LISTEN_FDS"], "2");
            assert_eq!(seen["env"]["LISTEN_FDNAMES"], "http:admin");
            assert_eq!(seen["env"]["NOTIFY_SOCKET"], "/run/test-notify");
            assert_eq!(seen["env"]["FROM_SERVICE_ENV"], "yes");
            assert_eq!(fds(&seen), [0, 1, 2, 3, 4], "exactly stdio and the sockets");

            let mut conn = TcpStream::connect_timeout(&http, secs(10.0)).unwrap();
            conn.set_read_timeout(Some(secs(20.0))).unwrap();
            assert_eq!(ask(&mut conn), format!("0 from {pid}"));
            let mut conn = UnixStream::connect(&path).unwrap();
            conn.set_read_timeout(Some(secs(20.0))).unwrap();
            assert_eq!(ask(&mut conn), format!("1 from {pid}"));
            assert_eq!(exit_code(pid), 0);
        },
    );
}

/// Several services: each gets its own sockets, as fds 3.. in its own
/// order, whatever fds tend holds them at.
#[test]
fn a_service_gets_only_its_own_sockets_as_fds_3_and_up_in_its_order() {
    alone(
        "a_service_gets_only_its_own_sockets_as_fds_3_and_up_in_its_order",
        || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("admin.sock");
            let held = sockets::bind_all(&[
                tcp("http", "127.0.0.1:0"),
                tcp("metrics", "127.0.0.1:0"),
                unix("admin", &path, None),
            ])
            .unwrap();
            let (http, metrics) = (tcp_port(&held, 0), tcp_port(&held, 1));
            let report = dir.path().join("report.json");
            let sockets = Sockets {
                held: &held,
                which: &[2, 0],
            };
            let pid = start_some(
                &reporter(&report),
                &BTreeMap::new(),
                Some(sockets),
                Fds::Inherited,
            );
            let seen = read_report(&report);
            assert_eq!(seen["env"]["LISTEN_FDS"], "2");
            assert_eq!(seen["env"]["LISTEN_FDNAMES"], "admin:http");
            assert_eq!(
                fds(&seen),
                [0, 1, 2, 3, 4],
                "its two sockets, nothing of the third"
            );
            let mut conn = UnixStream::connect(&path).unwrap();
            conn.set_read_timeout(Some(secs(20.0))).unwrap();
            assert_eq!(ask(&mut conn), format!("0 from {pid}"), "admin is its fd 3");
            let mut conn = TcpStream::connect_timeout(&http, secs(10.0)).unwrap();
            conn.set_read_timeout(Some(secs(20.0))).unwrap();
            assert_eq!(ask(&mut conn), format!("1 from {pid}"), "http is its fd 4");
            assert_eq!(exit_code(pid), 0);
            // tend still holds all three where they were.
            assert!(is_socket(3) && is_socket(4) && is_socket(5));
            assert_eq!(tcp_port(&held, 1), metrics);
        },
    );
}

/// A child that is given the sockets but not what tend inherited (a check
/// that asks for its service's sockets) gets stdio and the sockets alone;
/// the service gets what tend inherited too.
#[test]
fn a_child_given_the_sockets_only_gets_exactly_stdio_and_the_sockets() {
    alone(
        "a_child_given_the_sockets_only_gets_exactly_stdio_and_the_sockets",
        || {
            let dir = tempfile::tempdir().unwrap();
            let held = sockets::bind_all(&[tcp("http", "127.0.0.1:0")]).unwrap();
            let http = tcp_port(&held, 0);
            // Open without close-on-exec, as a descriptor tend inherited.
            let null = fs::File::open("/dev/null").unwrap();
            assert_eq!(unsafe { libc::dup2(null.as_raw_fd(), 9) }, 9);
            for (given, expected) in [
                (Fds::None, vec![0, 1, 2, 3]),
                (Fds::Inherited, vec![0, 1, 2, 3, 9]),
            ] {
                let report = dir.path().join(format!("{given:?}.json"));
                let pid = start_with(&reporter(&report), &BTreeMap::new(), Some(&held), given);
                let seen = read_report(&report);
                assert_eq!(fds(&seen), expected, "{given:?}");
                assert_eq!(seen["env"]["LISTEN_FDS"], "1");
                let mut conn = TcpStream::connect_timeout(&http, secs(10.0)).unwrap();
                conn.set_read_timeout(Some(secs(20.0))).unwrap();
                assert_eq!(ask(&mut conn), format!("0 from {pid}"));
                assert_eq!(exit_code(pid), 0);
            }
        },
    );
}

#[test]
fn a_connection_made_between_two_instances_waits_for_the_next_one() {
    alone(
        "a_connection_made_between_two_instances_waits_for_the_next_one",
        || {
            let dir = tempfile::tempdir().unwrap();
            let held = sockets::bind_all(&[tcp("http", "127.0.0.1:0")]).unwrap();
            let http = tcp_port(&held, 0);
            let env = BTreeMap::new();

            let first = dir.path().join("first.json");
            let pid = start(&reporter(&first), &env, Some(&held));
            let mut conn = TcpStream::connect_timeout(&http, secs(10.0)).unwrap();
            assert_eq!(ask(&mut conn), format!("0 from {pid}"));
            assert_eq!(exit_code(pid), 0);

            // No instance runs now: the connection is queued, not refused.
            let mut waiting = TcpStream::connect_timeout(&http, secs(10.0)).unwrap();
            let second = dir.path().join("second.json");
            let pid = start(&reporter(&second), &env, Some(&held));
            waiting.set_read_timeout(Some(secs(20.0))).unwrap();
            assert_eq!(ask(&mut waiting), format!("0 from {pid}"));
            assert_eq!(exit_code(pid), 0);
        },
    );
}

#[test]
fn a_job_without_sockets_has_none_of_them_open() {
    alone("a_job_without_sockets_has_none_of_them_open", || {
        let dir = tempfile::tempdir().unwrap();
        let _held =
            sockets::bind_all(&[tcp("http", "127.0.0.1:0"), tcp("metrics", "[::1]:0")]).unwrap();
        assert!(is_socket(3) && is_socket(4));
        let report = dir.path().join("report.json");
        let pid = start(&reporter(&report), &BTreeMap::new(), None);
        let seen = read_report(&report);
        assert_eq!(fds(&seen), [0, 1, 2], "no socket reaches a job");
        assert_eq!(seen["env"]["LISTEN_FDS"], serde_json::Value::Null);
        assert_eq!(seen["env"]["NOTIFY_SOCKET"], "/run/test-notify");
        assert_eq!(exit_code(pid), 0);
    });
}

#[test]
fn sockets_take_fds_3_and_up_even_when_tend_inherited_fds_there() {
    alone(
        "sockets_take_fds_3_and_up_even_when_tend_inherited_fds_there",
        || {
            // fd 4 is taken (inherited), fd 3 is free: the kernel gives the
            // sockets 3 and 5, and they must end up at 3 and 4.
            let file = fs::File::open("/proc/self/stat").unwrap();
            assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), 4) }, 4);
            drop(file);
            assert!(!is_open(3) && is_open(4) && !is_open(5));

            let held =
                sockets::bind_all(&[tcp("a", "127.0.0.1:0"), tcp("b", "127.0.0.1:0")]).unwrap();
            assert!(is_socket(3) && is_socket(4), "sockets at 3 and 4");
            assert!(!is_open(5), "no temporary fd is left behind");
            for fd in [3, 4] {
                let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
                assert_eq!(
                    flags & libc::FD_CLOEXEC,
                    libc::FD_CLOEXEC,
                    "fd {fd} close-on-exec"
                );
            }
            // Each name still goes with its own socket.
            for (i, fd) in [(0, 3), (1, 4)] {
                let addr: nix::sys::socket::SockaddrIn = nix::sys::socket::getsockname(fd).unwrap();
                assert_eq!(
                    tcp_port(&held, i).port(),
                    addr.port(),
                    "socket {i} at fd {fd}"
                );
            }
        },
    );
}

#[test]
fn a_unix_socket_gets_its_mode_and_replaces_only_an_old_socket_file() {
    alone(
        "a_unix_socket_gets_its_mode_and_replaces_only_an_old_socket_file",
        || {
            let dir = tempfile::tempdir().unwrap();
            let old = dir.path().join("old.sock");
            drop(UnixListener::bind(&old).unwrap());
            let fresh = dir.path().join("fresh.sock");
            let held =
                sockets::bind_all(&[unix("old", &old, Some(0o600)), unix("fresh", &fresh, None)])
                    .unwrap();
            let mode = |p: &PathBuf| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode(&old), 0o600);
            assert_eq!(mode(&fresh), sockets::DEFAULT_MODE);
            assert!(fs::metadata(&old).unwrap().file_type().is_socket());
            UnixStream::connect(&old).expect("the old path listens again");
            drop(held);

            let file = dir.path().join("data.txt");
            fs::write(&file, "keep me").unwrap();
            let err = sockets::bind_all(&[unix("data", &file, None)]).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "cannot listen on unix:{} (socket \"data\"): {} exists and is not a \
                     socket (tend removes only an old socket file)",
                    file.display(),
                    file.display()
                )
            );
            assert_eq!(fs::read_to_string(&file).unwrap(), "keep me");
        },
    );
}

#[test]
fn a_taken_port_is_an_error_that_names_the_socket_and_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = sockets::bind_all(&[tcp("http", &addr.to_string())]).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("cannot listen on {addr} (socket \"http\"): bind(): Address already in use")
    );
}

#[test]
fn a_spawn_with_sockets_searches_path_and_fails_like_any_spawn() {
    alone(
        "a_spawn_with_sockets_searches_path_and_fails_like_any_spawn",
        || {
            let dir = tempfile::tempdir().unwrap();
            let held = sockets::bind_all(&[tcp("http", "127.0.0.1:0")]).unwrap();
            let spawn = |argv: &[&str], env: &BTreeMap<String, String>| {
                let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
                spawn::spawn(Spec {
                    argv: &argv,
                    env,
                    working_dir: None,
                    take_terminal: false,
                    output: Output::Inherit,
                    sockets: Some(Sockets {
                        held: &held,
                        which: &[0],
                    }),
                    extra_env: &[],
                    stdin_null: false,
                    user: None,
                    fds: Fds::Inherited,
                })
            };
            let no_env = BTreeMap::new();

            let missing = spawn(&["tend-no-such-program"], &no_env).unwrap_err();
            assert!(matches!(missing, SpawnError::NotFound { .. }), "{missing}");
            assert_eq!(missing.exit_code(), 127);

            let plain = dir.path().join("plain");
            fs::write(&plain, "#!/bin/sh\n").unwrap();
            let path = plain.display().to_string();
            let denied = spawn(&[&path], &no_env).unwrap_err();
            assert!(
                matches!(denied, SpawnError::NotExecutable { .. }),
                "{denied}"
            );
            assert_eq!(denied.exit_code(), 126);

            // The service's own PATH is searched, as execvp would.
            let bin = dir.path().join("bin");
            fs::create_dir(&bin).unwrap();
            let marker = dir.path().join("ran");
            let script = bin.join("tend-test-app");
            fs::write(
                &script,
                format!(
                    "#!/bin/sh\necho \"$LISTEN_FDS $0\" > {}\n",
                    marker.display()
                ),
            )
            .unwrap();
            fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
            let env = BTreeMap::from([(
                "PATH".to_string(),
                format!("/nonexistent:{}:/usr/bin:/bin", bin.display()),
            )]);
            let pid = spawn(&["tend-test-app"], &env).unwrap();
            assert_eq!(exit_code(pid), 0);
            assert_eq!(
                fs::read_to_string(&marker).unwrap(),
                format!("1 {}\n", script.display()),
                "found through the service's PATH"
            );
        },
    );
}
