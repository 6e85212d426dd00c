//! `on_change = "http"` as the core sees it: a call out, its answer back.

use super::*;

const URL: &str = "http://127.0.0.1:9090/-/reload";

fn http_watch(name: &str, url: &str) -> String {
    format!(
        "[[watch]]\nname = \"{name}\"\npaths = [\"/{name}\"]\ncheck = [\"chk\"]\n\
         on_change = \"http\"\nhttp = {{ url = \"{url}\", timeout = \"2s\" }}\n"
    )
}

/// The calls asked for in `commands`: (token, url).
fn calls(commands: &[Command]) -> Vec<(u64, String)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::CallHttp { token, action } => Some((*token, action.url.clone())),
            _ => None,
        })
        .collect()
}

fn cancelled(commands: &[Command]) -> Vec<u64> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::CancelCall { token } => Some(*token),
            _ => None,
        })
        .collect()
}

impl Fake {
    /// Call `token` ended with `code` (and a first line), after `secs`.
    fn answered(&mut self, token: u64, code: u16, secs: f64) -> Vec<Command> {
        self.elapsed += Duration::from_secs_f64(secs);
        self.send(Event::Called {
            token,
            result: Ok(Answer {
                code,
                line: "reloaded".into(),
            }),
            took: Duration::from_secs_f64(secs),
        })
    }

    /// A change of watch `w` to content `n`, checked and valid: the commands
    /// after its check.
    fn valid_change(&mut self, w: usize, n: u8) -> Vec<Command> {
        self.content(w, n);
        let check = self.job("chk");
        self.exit(check, OK)
    }
}

#[test]
fn an_http_action_is_a_call_whose_answer_ends_the_action_like_an_exit() {
    let mut f = Fake::started(&http_watch("app", URL), 1);
    let c = f.valid_change(0, 1);
    let [(token, url)] = &calls(&c)[..] else {
        panic!("one call: {c:?}")
    };
    assert_eq!(url, URL);
    let token = *token;
    assert!(spawns(&c).is_empty(), "no process: {c:?}");
    assert_eq!(f.result(0), WatchResult::Pending);
    assert!(f.core.deadline().is_some(), "the call's backstop is due");

    f.answered(token, 500, 0.01);
    assert_eq!(f.result(0), WatchResult::ActionFailed);
    assert_eq!(f.state(), (State::Reloading, false));
    // Retried after the back-off, as an exec action is.
    let c = f.at_deadline();
    let [(again, _)] = calls(&c)[..] else {
        panic!("a retry: {c:?}")
    };
    assert_ne!(again, token);
    f.answered(token, 200, 0.0);
    assert_eq!(
        f.result(0),
        WatchResult::ActionFailed,
        "an answer to a call that is over is ignored"
    );
    f.answered(again, 204, 0.01);
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.deadline(), None, "nothing is left in flight");
}

#[test]
fn a_call_without_an_outcome_is_dropped_at_its_backstop_and_fails() {
    let mut f = Fake::started(&http_watch("app", URL), 1);
    let c = f.valid_change(0, 1);
    let [(token, _)] = calls(&c)[..] else {
        panic!("one call: {c:?}")
    };
    let c = f.after(2.5);
    assert!(cancelled(&c).is_empty(), "within timeout + 1 s: {c:?}");
    let c = f.after(0.5);
    assert_eq!(cancelled(&c), [token]);
    assert_eq!(f.result(0), WatchResult::ActionFailed);
}

#[test]
fn a_stop_drops_the_calls_in_flight() {
    let mut f = Fake::started(&http_watch("app", URL), 1);
    let [(token, _)] = calls(&f.valid_change(0, 1))[..] else {
        panic!("one call")
    };
    let c = f.signal(TERM);
    assert_eq!(cancelled(&c), [token]);
    f.answered(token, 200, 0.0);
    assert_eq!(f.result(0), WatchResult::Pending, "too late to count");
}
