//! Watched paths that do not exist: a volume that is not mounted keeps
//! tend not ready (unless the watch is `optional`), while the service
//! starts as it would.

use super::*;

impl Fake {
    /// Content `n` of watch `watch`, whose scan did not find `missing`.
    fn content_missing(&mut self, watch: usize, n: u8, missing: &[&str]) -> Vec<Command> {
        self.send(Event::Content(Report {
            watch: WatchId(watch),
            fingerprint: test_fingerprint(n),
            changed: Vec::new(),
            files: 0,
            missing: missing.iter().map(PathBuf::from).collect(),
            unreadable: Vec::new(),
        }))
    }

    fn missing(&mut self, watch: usize) -> Vec<String> {
        self.core.status().watches[watch].missing.clone()
    }
}

#[test]
fn a_missing_path_starts_the_service_but_keeps_tend_not_ready_until_it_appears() {
    let mut f = Fake::new(CHECKED);
    f.tick();
    f.content_missing(0, 0, &["/a"]);
    f.exit(f.job("check"), OK);
    assert_eq!(f.services().len(), 1, "the service starts as it would");
    assert_eq!(f.state(), (State::Starting, false));
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.missing(0), ["/a"]);
    // An empty directory there has the same content: no new check, ready.
    let c = f.content_missing(0, 0, &[]);
    assert!(spawns(&c).is_empty(), "{c:?}");
    assert_eq!(f.state(), (State::Ready, true));
    assert!(f.missing(0).is_empty());
    // Gone again.
    f.content_missing(0, 0, &["/a"]);
    assert_eq!(f.state(), (State::Starting, false));
}

#[test]
fn a_path_that_appears_with_content_is_checked_and_applied_then_ready() {
    let mut f = Fake::new(CHECKED);
    f.tick();
    f.content_missing(0, 0, &["/a"]);
    f.exit(f.job("check"), OK);
    let svc = f.service();
    f.content_missing(0, 1, &[]);
    assert_eq!(
        f.state(),
        (State::Reloading, true),
        "the path is there, and the service runs a checked config while the new one is checked"
    );
    let c = f.exit(f.job("check"), OK);
    assert_eq!(signalled(&c, svc), [Signal::SIGHUP as i32]);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn one_missing_path_of_several_is_enough_to_be_not_ready() {
    let mut f = Fake::new(TWO);
    f.tick();
    f.content(0, 0);
    f.content_missing(1, 0, &["/b"]);
    while let Some(pid) = f.running_check() {
        f.exit(pid, OK);
    }
    assert_eq!(f.state(), (State::Starting, false));
    let s = f.core.status();
    assert_eq!(
        crate::probe::verdict(&s).1,
        "not ready: state starting; watch \"b\": /b does not exist (mount the volume there, or set optional = true)"
    );
}

#[test]
fn an_optional_watch_is_ready_without_its_path() {
    let mut f = Fake::new(&CHECKED.replace("on_change", "optional = true\non_change"));
    f.tick();
    f.content_missing(0, 0, &["/a"]);
    f.exit(f.job("check"), OK);
    assert_eq!(f.state(), (State::Ready, true));
    assert!(f.missing(0).is_empty());
}

#[test]
fn invalid_config_ready_does_not_make_a_missing_path_ready() {
    let mut f = Fake::custom(CHECKED, true, |k| k.ready_when_invalid = true);
    f.tick();
    f.content(0, 0);
    f.exit(f.job("check"), OK);
    assert_eq!(f.state(), (State::Ready, true));
    f.content_missing(0, 1, &["/a"]);
    f.exit(f.job("check"), FAIL);
    assert_eq!(f.result(0), WatchResult::Invalid);
    assert!(
        !f.state().1,
        "a rejected change is ready, a missing volume is not"
    );
}
