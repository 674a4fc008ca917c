//! What the API server answered to a write, for the tests of who may write a Node (the node
//! guard, the prober's ValidatingAdmissionPolicy).

/// What the API server answered to a write.
#[derive(Debug)]
pub enum Answer {
    Ok,
    Refused { code: u16, message: String },
}

impl Answer {
    /// The answer in `r`; a transport error is no answer and fails the test.
    pub fn of<T>(r: Result<T, kube::Error>) -> Answer {
        match r {
            Ok(_) => Answer::Ok,
            Err(kube::Error::Api(e)) => Answer::Refused {
                code: e.code,
                message: e.message,
            },
            Err(e) => panic!("transport error: {e}"),
        }
    }

    #[track_caller]
    pub fn assert_ok(&self, what: &str) {
        assert!(matches!(self, Answer::Ok), "{what}: {self:?}");
    }

    /// Refused by `refuser` (403, a message holding `mark` and `words`), not by RBAC.
    #[track_caller]
    pub fn assert_refused_by(&self, refuser: &str, mark: &str, what: &str, words: &str) {
        match self {
            Answer::Refused { code: 403, message }
                if message.contains(mark) && message.contains(words) => {}
            other => panic!("{what}: expected the {refuser}'s {words:?}, got {other:?}"),
        }
    }
}
