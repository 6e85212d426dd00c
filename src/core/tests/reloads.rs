//! `on_change = "http"` as the core sees it (a call out, its answer back),
//! and what /metrics says of the reloads: the aggregate that one watch's
//! success does not hide, apply operations, configmap-reload's series.

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

    /// Call `token` got no answer.
    fn unanswered(&mut self, token: u64) -> Vec<Command> {
        self.send(Event::Called {
            token,
            result: Err("cannot connect to 127.0.0.1:9090: Connection refused".into()),
            took: Duration::ZERO,
        })
    }

    /// A change of watch `w` to content `n`, checked and valid: the commands
    /// after its check.
    fn valid_change(&mut self, w: usize, n: u8) -> Vec<Command> {
        self.content(w, n);
        let check = self.job("chk");
        self.exit(check, OK)
    }

    /// The page's sample of `series`, as a number.
    fn metric(&mut self, series: &str) -> f64 {
        sample(&self.page(), series).parse().unwrap()
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
    assert_eq!(
        f.metric(&format!(
            "configmap_reload_request_errors_total{{webhook=\"{URL}\",reason=\"client_request_do\"}}"
        )),
        1.0
    );
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

#[test]
fn one_watch_rejected_keeps_the_aggregate_at_0_while_another_succeeds() {
    let two = format!(
        "{}{}",
        metered_watch("on_change = \"signal\""),
        "[[watch]]\nname = \"b\"\npaths = [\"/b\"]\ncheck = [\"chk\"]\non_change = \"signal\"\n"
    );
    let mut f = Fake::new(&two);
    f.tick();
    f.valid_change(0, 0);
    f.valid_change(1, 0);
    assert_eq!(f.services().len(), 1);
    assert_eq!(f.metric("reloader_last_reload_successful"), 1.0);
    // a is rejected, then b is applied: the stock alert must still see 0.
    f.content(0, 1);
    f.finish("chk", 1, 0.0);
    f.valid_change(1, 1);
    let (reloads, failed, _, _) = f.reloads();
    assert_eq!((reloads, failed), (4, 1));
    assert_eq!(f.metric("reloader_last_reload_successful"), 0.0);
    assert_eq!(
        f.metric("tend_watch_last_reload_successful{watch=\"app\"}"),
        0.0
    );
    assert_eq!(
        f.metric("tend_watch_last_reload_successful{watch=\"b\"}"),
        1.0
    );
    // b again: still 0 while a is broken.
    f.valid_change(1, 2);
    assert_eq!(f.metric("reloader_last_reload_successful"), 0.0);
    // a fixed: every watch's latest reload succeeded.
    f.valid_change(0, 2);
    assert_eq!(f.metric("reloader_last_reload_successful"), 1.0);
    assert_eq!(
        f.metric("tend_watch_last_reload_successful{watch=\"app\"}"),
        1.0
    );
}

#[test]
fn every_gauge_is_0_until_a_reload_succeeds() {
    let two = format!("{}{}", http_watch("a", URL), http_watch("b", URL));
    let mut f = Fake::new(&two);
    f.tick();
    f.valid_change(0, 0);
    for series in [
        "reloader_last_reload_successful",
        "tend_watch_last_reload_successful{watch=\"a\"}",
        "tend_watch_last_reload_successful{watch=\"b\"}",
    ] {
        assert_eq!(
            f.metric(series),
            0.0,
            "{series}: the service has not started"
        );
    }
    f.valid_change(1, 0);
    for series in [
        "reloader_last_reload_successful",
        "tend_watch_last_reload_successful{watch=\"a\"}",
        "tend_watch_last_reload_successful{watch=\"b\"}",
    ] {
        assert_eq!(f.metric(series), 1.0, "{series}: started on both");
    }
}

#[test]
fn apply_operations_are_actions_without_publish() {
    let mut f = Fake::started(
        &metered_watch("on_change = \"exec\"\nexec = [\"reload\"]"),
        1,
    );
    assert_eq!(
        f.metric("reloader_config_apply_operations_total"),
        0.0,
        "a start is not an apply operation"
    );
    f.valid_change(0, 1);
    f.finish("reload", 1, 0.0);
    assert_eq!(f.metric("reloader_config_apply_operations_total"), 1.0);
    assert_eq!(
        f.metric("reloader_config_apply_operations_failed_total"),
        1.0
    );
    f.at_deadline();
    f.finish("reload", 0, 0.0);
    assert_eq!(f.metric("reloader_config_apply_operations_total"), 2.0);
    assert_eq!(
        f.metric("reloader_config_apply_operations_failed_total"),
        1.0
    );
    f.content(0, 2);
    f.finish("chk", 1, 0.0);
    assert_eq!(
        f.metric("reloader_config_apply_operations_total"),
        2.0,
        "a rejected change applies nothing"
    );
}

#[test]
fn apply_operations_are_publications_with_publish() {
    let mut f = Fake::publishing();
    assert_eq!(f.metric("reloader_config_apply_operations_total"), 1.0);
    f.candidate(2, "/pub/..g2", OK);
    f.publication(2, Err("No space left on device"));
    assert_eq!(f.metric("reloader_config_apply_operations_total"), 2.0);
    assert_eq!(
        f.metric("reloader_config_apply_operations_failed_total"),
        1.0
    );
}

#[test]
fn configmap_reload_series_count_each_call_by_endpoint() {
    let other = "http://127.0.0.1:9091/-/reload";
    let two = format!("{}{}", http_watch("a", URL), http_watch("b", other));
    let mut f = Fake::new(&two);
    f.tick();
    f.valid_change(0, 0);
    f.valid_change(1, 0);
    let page = f.page();
    assert!(
        page.contains(&format!(
            "configmap_reload_success_reloads_total{{webhook=\"{URL}\"}} 0\n"
        )),
        "{page}"
    );
    assert!(
        !page.contains("configmap_reload_last_reload_error{"),
        "no call yet: {page}"
    );
    assert_eq!(f.metric("configmap_reload_watcher_errors_total"), 0.0);

    let [(token, _)] = calls(&f.valid_change(0, 1))[..] else {
        panic!("one call")
    };
    f.answered(token, 503, 0.25);
    let series = |name: &str, url: &str, more: &str| format!("{name}{{webhook=\"{url}\"{more}}}");
    assert_eq!(
        f.metric(&series(
            "configmap_reload_requests_total",
            URL,
            ",status_code=\"503\""
        )),
        1.0
    );
    assert_eq!(
        f.metric(&series(
            "configmap_reload_request_errors_total",
            URL,
            ",reason=\"client_response\""
        )),
        1.0
    );
    assert_eq!(
        f.metric(&series("configmap_reload_last_reload_error", URL, "")),
        1.0
    );
    let c = f.at_deadline();
    let [(token, _)] = calls(&c)[..] else {
        panic!("a retry")
    };
    f.unanswered(token);
    assert_eq!(
        f.metric(&series(
            "configmap_reload_request_errors_total",
            URL,
            ",reason=\"client_request_do\""
        )),
        1.0
    );
    let c = f.at_deadline();
    let [(token, _)] = calls(&c)[..] else {
        panic!("a retry")
    };
    f.answered(token, 200, 0.125);
    assert_eq!(
        f.metric(&series("configmap_reload_success_reloads_total", URL, "")),
        1.0
    );
    assert_eq!(
        f.metric(&series(
            "configmap_reload_last_request_duration_seconds",
            URL,
            ""
        )),
        0.125
    );
    assert_eq!(
        f.metric(&series("configmap_reload_last_reload_error", URL, "")),
        0.0
    );
    assert_eq!(
        f.metric(&series("configmap_reload_success_reloads_total", other, "")),
        0.0,
        "the other endpoint was not called"
    );
}

#[test]
fn the_watchers_counts_are_on_the_page() {
    let mut f = Fake::started(&metered_watch("on_change = \"signal\""), 1);
    let status = f.core.status();
    let counts = metrics::WatcherCounts {
        paths: 3,
        events: 42,
        errors: 2,
    };
    let page = f.core.metrics().render(&status, &counts);
    assert_eq!(sample(&page, "reloader_watches"), "3");
    assert_eq!(sample(&page, "reloader_watch_events_total"), "42");
    assert_eq!(sample(&page, "reloader_watch_errors_total"), "2");
    assert_eq!(sample(&page, "configmap_reload_watcher_errors_total"), "2");
}
