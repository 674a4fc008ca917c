//! Execution of parsed templates with Go `text/template` semantics.

use std::collections::BTreeMap;

use super::funcs;
use super::parse::{self, Command, Node, Operand, Pipe};
use super::value::Value;
use super::TemplateError;

/// What a map lookup of a missing key yields (Go's `missingkey` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// `missingkey=default`: no value; prints `<no value>`; chained fields are no value too.
    #[default]
    Default,
    /// `missingkey=zero` (Helm's setting): a nil interface; prints `<no value>`, and a field
    /// of it is an error ("nil pointer evaluating interface {}.x").
    Zero,
    /// `missingkey=error`: an error.
    Error,
}

/// A set of named templates that can call each other (`template`, `include`), like a Go
/// `*template.Template` with its associated templates.
#[derive(Debug, Clone, Default)]
pub struct TemplateSet {
    named: BTreeMap<String, Vec<Node>>,
    /// The `missingkey` option.
    pub missing_key: MissingKey,
}

/// Nested `include`/`template` calls are bounded (Helm stops at 1000; this renderer at 100,
/// which keeps the recursion inside a test thread's stack and is far beyond any chart's need).
const MAX_DEPTH: usize = 100;

enum Flow {
    Normal,
    Break,
    Continue,
}

impl TemplateSet {
    /// An empty set with the default `missingkey` option.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `src` and adds it under `name`, plus every template it `define`s.
    pub fn add(&mut self, name: &str, src: &str) -> Result<(), TemplateError> {
        let parsed = parse::parse(name, src, &funcs::is_function)?;
        self.named.insert(name.to_string(), parsed.body);
        for (n, body) in parsed.defines {
            self.named.insert(n, body);
        }
        Ok(())
    }

    /// True when a template of that name exists.
    pub fn has(&self, name: &str) -> bool {
        self.named.contains_key(name)
    }

    /// Executes template `name` with `data` as dot and `$`.
    pub fn execute(&self, name: &str, data: &Value) -> Result<String, TemplateError> {
        let mut out = String::new();
        let mut st = State {
            set: self,
            template: name.to_string(),
            vars: Vec::new(),
            depth: 0,
        };
        st.run_named(name, data, &mut out)?;
        Ok(out)
    }
}

struct State<'a> {
    set: &'a TemplateSet,
    template: String,
    vars: Vec<(String, Value)>,
    depth: usize,
}

impl State<'_> {
    fn err(&self, line: usize, msg: impl Into<String>) -> TemplateError {
        TemplateError::Exec {
            template: self.template.clone(),
            line,
            msg: msg.into(),
        }
    }

    fn run_named(
        &mut self,
        name: &str,
        dot: &Value,
        out: &mut String,
    ) -> Result<(), TemplateError> {
        let Some(body) = self.set.named.get(name) else {
            return Err(TemplateError::NoTemplate(name.to_string()));
        };
        if self.depth >= MAX_DEPTH {
            return Err(self.err(
                0,
                format!("exceeded max template depth ({MAX_DEPTH}) in {name:?}"),
            ));
        }
        // A called template gets its own variables: only `$`, bound to its dot.
        let saved_vars = std::mem::replace(&mut self.vars, vec![("$".to_string(), dot.clone())]);
        let saved_name = std::mem::replace(&mut self.template, name.to_string());
        self.depth += 1;
        let r = self.walk(dot, body, out);
        self.depth -= 1;
        self.template = saved_name;
        self.vars = saved_vars;
        match r? {
            Flow::Normal => Ok(()),
            Flow::Break | Flow::Continue => Err(self.err(0, "break or continue outside range")),
        }
    }

    fn walk(
        &mut self,
        dot: &Value,
        nodes: &[Node],
        out: &mut String,
    ) -> Result<Flow, TemplateError> {
        for node in nodes {
            match node {
                Node::Text(t) => out.push_str(t),
                Node::Action { line, pipe } => {
                    let v = self.pipeline(*line, dot, pipe)?;
                    // A declaration prints nothing.
                    if pipe.decl.is_empty() {
                        out.push_str(&v.to_go_string());
                    }
                }
                Node::If {
                    line,
                    pipe,
                    then,
                    els,
                } => {
                    let mark = self.vars.len();
                    let v = self.pipeline(*line, dot, pipe)?;
                    let flow = if v.truthy() {
                        self.walk(dot, then, out)?
                    } else if let Some(e) = els {
                        self.walk(dot, e, out)?
                    } else {
                        Flow::Normal
                    };
                    self.vars.truncate(mark);
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::With {
                    line,
                    pipe,
                    body,
                    els,
                } => {
                    let mark = self.vars.len();
                    let v = self.pipeline(*line, dot, pipe)?;
                    let flow = if v.truthy() {
                        self.walk(&v, body, out)?
                    } else if let Some(e) = els {
                        self.walk(dot, e, out)?
                    } else {
                        Flow::Normal
                    };
                    self.vars.truncate(mark);
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Range {
                    line,
                    pipe,
                    body,
                    els,
                } => {
                    let flow = self.range(*line, dot, pipe, body, els.as_deref(), out)?;
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Template { line, name, pipe } => {
                    let arg = match pipe {
                        Some(p) => {
                            let mark = self.vars.len();
                            let v = self.pipeline(*line, dot, p)?;
                            self.vars.truncate(mark);
                            v
                        }
                        None => Value::Nil,
                    };
                    self.run_named(name, &arg, out).map_err(|e| match e {
                        TemplateError::NoTemplate(n) => self.err(
                            *line,
                            format!(
                                "template: no template {n:?} associated with template {:?}",
                                self.template
                            ),
                        ),
                        other => other,
                    })?;
                }
                Node::Break => return Ok(Flow::Break),
                Node::Continue => return Ok(Flow::Continue),
            }
        }
        Ok(Flow::Normal)
    }

    fn range(
        &mut self,
        line: usize,
        dot: &Value,
        pipe: &Pipe,
        body: &[Node],
        els: Option<&[Node]>,
        out: &mut String,
    ) -> Result<Flow, TemplateError> {
        let mark = self.vars.len();
        // Evaluate without declaring: the range variables take each element.
        let plain = Pipe {
            decl: Vec::new(),
            assign: false,
            cmds: pipe.cmds.clone(),
        };
        let v = self.pipeline(line, dot, &plain)?;
        let items: Vec<(Value, Value)> = match v {
            Value::List(l) => l
                .into_iter()
                .enumerate()
                .map(|(i, e)| (Value::Int(i as i64), e))
                .collect(),
            // Go ranges over maps in sorted key order.
            Value::Map(m) => m.into_iter().map(|(k, e)| (Value::Str(k), e)).collect(),
            Value::ApiVersions(l) => l
                .into_iter()
                .enumerate()
                .map(|(i, e)| (Value::Int(i as i64), Value::Str(e)))
                .collect(),
            Value::Invalid | Value::Nil => Vec::new(),
            Value::Int(n) if n >= 0 => (0..n).map(|i| (Value::Int(i), Value::Int(i))).collect(),
            other => {
                return Err(self.err(
                    line,
                    format!("range can't iterate over {}", other.to_go_string()),
                ))
            }
        };
        if items.is_empty() {
            let flow = match els {
                Some(e) => self.walk(dot, e, out)?,
                None => Flow::Normal,
            };
            self.vars.truncate(mark);
            return Ok(flow);
        }
        for (k, e) in items {
            let m = self.vars.len();
            match pipe.decl.len() {
                0 => {}
                1 => self.bind(line, &pipe.decl[0], e.clone(), pipe.assign)?,
                _ => {
                    self.bind(line, &pipe.decl[0], k, pipe.assign)?;
                    self.bind(line, &pipe.decl[1], e.clone(), pipe.assign)?;
                }
            }
            let flow = self.walk(&e, body, out)?;
            self.vars.truncate(m.max(mark));
            match flow {
                Flow::Break => break,
                Flow::Continue | Flow::Normal => {}
            }
        }
        self.vars.truncate(mark);
        Ok(Flow::Normal)
    }

    fn bind(
        &mut self,
        line: usize,
        name: &str,
        v: Value,
        assign: bool,
    ) -> Result<(), TemplateError> {
        if assign {
            match self.vars.iter_mut().rev().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = v,
                None => return Err(self.err(line, format!("undefined variable: {name}"))),
            }
        } else {
            self.vars.push((name.to_string(), v));
        }
        Ok(())
    }

    fn var(&self, line: usize, name: &str) -> Result<Value, TemplateError> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| self.err(line, format!("undefined variable: {name}")))
    }

    fn pipeline(&mut self, line: usize, dot: &Value, pipe: &Pipe) -> Result<Value, TemplateError> {
        let mut val: Option<Value> = None;
        for cmd in &pipe.cmds {
            val = Some(self.command(line, dot, cmd, val)?);
        }
        let v = val.unwrap_or(Value::Invalid);
        // Go unwraps a nil interface into "no value" at the end of a pipeline.
        let v = if matches!(v, Value::Nil) {
            Value::Invalid
        } else {
            v
        };
        for name in &pipe.decl {
            self.bind(line, name, v.clone(), pipe.assign)?;
        }
        Ok(v)
    }

    fn command(
        &mut self,
        line: usize,
        dot: &Value,
        cmd: &Command,
        piped: Option<Value>,
    ) -> Result<Value, TemplateError> {
        let first = &cmd.args[0];
        let rest = &cmd.args[1..];
        match first {
            Operand::Func(name) => self.call(line, dot, name, rest, piped),
            Operand::Field(chain) => {
                let args = self.args(line, dot, rest, piped)?;
                self.field_chain(line, dot.clone(), chain, args, &first.describe())
            }
            Operand::Var(name, chain) if !chain.is_empty() => {
                let args = self.args(line, dot, rest, piped)?;
                let base = self.var(line, name)?;
                self.field_chain(line, base, chain, args, &first.describe())
            }
            Operand::Sub(p, chain) if !chain.is_empty() => {
                let args = self.args(line, dot, rest, piped)?;
                let base = self.pipeline(line, dot, p)?;
                self.field_chain(line, base, chain, args, &first.describe())
            }
            _ => {
                if !rest.is_empty() || piped.is_some() {
                    return Err(self.err(
                        line,
                        format!("can't give argument to non-function {}", first.describe()),
                    ));
                }
                self.operand(line, dot, first)
            }
        }
    }

    fn args(
        &mut self,
        line: usize,
        dot: &Value,
        ops: &[Operand],
        piped: Option<Value>,
    ) -> Result<Vec<Value>, TemplateError> {
        let mut v = Vec::with_capacity(ops.len() + 1);
        for op in ops {
            v.push(self.operand(line, dot, op)?);
        }
        if let Some(p) = piped {
            v.push(p);
        }
        Ok(v)
    }

    /// An operand used as an argument (no arguments of its own).
    fn operand(&mut self, line: usize, dot: &Value, op: &Operand) -> Result<Value, TemplateError> {
        Ok(match op {
            Operand::Dot => dot.clone(),
            Operand::Field(chain) => {
                self.field_chain(line, dot.clone(), chain, Vec::new(), &op.describe())?
            }
            Operand::Var(name, chain) => {
                let base = self.var(line, name)?;
                if chain.is_empty() {
                    base
                } else {
                    self.field_chain(line, base, chain, Vec::new(), &op.describe())?
                }
            }
            Operand::Sub(p, chain) => {
                let base = self.pipeline(line, dot, p)?;
                if chain.is_empty() {
                    base
                } else {
                    self.field_chain(line, base, chain, Vec::new(), &op.describe())?
                }
            }
            Operand::Func(name) => self.call(line, dot, name, &[], None)?,
            Operand::Str(s) => Value::Str(s.clone()),
            Operand::Int(i) => Value::Int(*i),
            Operand::Float(f) => Value::Float(*f),
            Operand::Bool(b) => Value::Bool(*b),
            Operand::Nil => return Err(self.err(line, "nil is not a command")),
        })
    }

    fn field_chain(
        &self,
        line: usize,
        mut recv: Value,
        chain: &[String],
        args: Vec<Value>,
        at: &str,
    ) -> Result<Value, TemplateError> {
        let n = chain.len();
        let mut args = Some(args);
        for (i, name) in chain.iter().enumerate() {
            let a = if i + 1 == n {
                args.take().unwrap_or_default()
            } else {
                Vec::new()
            };
            recv = self.field(recv, name, a).map_err(|m| {
                self.err(
                    line,
                    format!("executing {:?} at <{at}>: {m}", self.template),
                )
            })?;
        }
        Ok(recv)
    }

    fn field(&self, recv: Value, name: &str, args: Vec<Value>) -> Result<Value, String> {
        match recv {
            Value::Invalid => {
                if self.set.missing_key == MissingKey::Error {
                    return Err(format!("nil data; no entry for key {name:?}"));
                }
                Ok(Value::Invalid)
            }
            Value::Nil => Err(format!("nil pointer evaluating interface {{}}.{name}")),
            Value::Map(mut m) => {
                if !args.is_empty() {
                    return Err(format!("{name} is not a method but has arguments"));
                }
                match m.remove(name) {
                    Some(v) => Ok(v),
                    None => match self.set.missing_key {
                        MissingKey::Default => Ok(Value::Invalid),
                        MissingKey::Zero => Ok(Value::Nil),
                        MissingKey::Error => Err(format!("map has no entry for key {name:?}")),
                    },
                }
            }
            Value::ApiVersions(list) => match (name, args.as_slice()) {
                ("Has", [Value::Str(v)]) => Ok(Value::Bool(list.iter().any(|x| x == v))),
                ("Has", _) => Err("wrong number or type of args for Has: want 1 string".into()),
                _ => Err(format!(
                    "can't evaluate field {name} in type chartutil.VersionSet"
                )),
            },
            Value::Files(files) => match (name, args.as_slice()) {
                ("Get", [Value::Str(p)]) => {
                    Ok(Value::Str(files.get(p).cloned().unwrap_or_default()))
                }
                ("Get", _) => Err("wrong number or type of args for Get: want 1 string".into()),
                _ => Err(format!("can't evaluate field {name} in type chart.Files")),
            },
            other => Err(format!(
                "can't evaluate field {name} in type {}",
                other.kind()
            )),
        }
    }

    fn call(
        &mut self,
        line: usize,
        dot: &Value,
        name: &str,
        ops: &[Operand],
        piped: Option<Value>,
    ) -> Result<Value, TemplateError> {
        match name {
            // Short-circuit: evaluate left to right, stop at the deciding value.
            "and" | "or" => {
                if ops.is_empty() && piped.is_none() {
                    return Err(self.err(
                        line,
                        format!("wrong number of args for {name}: want at least 1 got 0"),
                    ));
                }
                let want = name == "or";
                let mut last = Value::Invalid;
                for op in ops {
                    last = self.operand(line, dot, op)?;
                    if last.truthy() == want {
                        return Ok(last);
                    }
                }
                if let Some(p) = piped {
                    last = p;
                }
                Ok(last)
            }
            "include" => {
                let args = self.args(line, dot, ops, piped)?;
                let (tname, data) = match args.as_slice() {
                    [Value::Str(n), d] => (n.clone(), d.clone()),
                    [Value::Str(n)] => (n.clone(), Value::Nil),
                    _ => {
                        return Err(self.err(line, "include wants a template name and one argument"))
                    }
                };
                let mut buf = String::new();
                let saved = self.depth;
                self.run_named(&tname, &data, &mut buf).map_err(|e| match e {
                    TemplateError::NoTemplate(n) => self.err(line, format!("error calling include: template: no template {n:?} associated with template \"gotpl\"")),
                    other => other,
                })?;
                self.depth = saved;
                Ok(Value::Str(buf))
            }
            _ => {
                let args = self.args(line, dot, ops, piped)?;
                funcs::call(name, args).map_err(|m| {
                    self.err(
                        line,
                        format!(
                            "executing {:?} at <{name}>: error calling {name}: {m}",
                            self.template
                        ),
                    )
                })
            }
        }
    }
}
