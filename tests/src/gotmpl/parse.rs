//! Lexing and parsing of Go `text/template` source into a tree.
//!
//! Covers the language Helm charts use: text and `{{ }}` actions with `{{-`/`-}}` trim
//! markers, `{{/* comments */}}`, pipelines, variables (`$`, `$x :=`, `$x =`,
//! `$i, $v :=` in range), literals, parenthesized pipelines with field chains,
//! `if`/`else if`/`else`, `range` (with `else`, `break`, `continue`), `with` (with `else`
//! and `else with`), `define`, `template` and `block`.

use std::collections::BTreeMap;

use super::TemplateError;

/// A parsed node.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Text(String),
    Action {
        line: usize,
        pipe: Pipe,
    },
    If {
        line: usize,
        pipe: Pipe,
        then: Vec<Node>,
        els: Option<Vec<Node>>,
    },
    Range {
        line: usize,
        pipe: Pipe,
        body: Vec<Node>,
        els: Option<Vec<Node>>,
    },
    With {
        line: usize,
        pipe: Pipe,
        body: Vec<Node>,
        els: Option<Vec<Node>>,
    },
    Template {
        line: usize,
        name: String,
        pipe: Option<Pipe>,
    },
    Break,
    Continue,
}

/// A pipeline with optional variable declaration (`$x :=`) or assignment (`$x =`).
#[derive(Debug, Clone)]
pub(crate) struct Pipe {
    pub decl: Vec<String>,
    pub assign: bool,
    pub cmds: Vec<Command>,
}

/// One command of a pipeline: an operand followed by arguments.
#[derive(Debug, Clone)]
pub(crate) struct Command {
    pub args: Vec<Operand>,
}

/// An operand.
#[derive(Debug, Clone)]
pub(crate) enum Operand {
    Dot,
    /// `.A.B`: a field chain on dot.
    Field(Vec<String>),
    /// `$x.A.B`.
    Var(String, Vec<String>),
    /// A function name.
    Func(String),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Nil,
    /// `(pipeline).A.B`.
    Sub(Box<Pipe>, Vec<String>),
}

impl Operand {
    /// Source-like text for error messages (`<.Values.x>`).
    pub(crate) fn describe(&self) -> String {
        match self {
            Operand::Dot => ".".into(),
            Operand::Field(f) => f.iter().map(|s| format!(".{s}")).collect(),
            Operand::Var(v, f) => {
                let mut s = v.clone();
                for x in f {
                    s.push('.');
                    s.push_str(x);
                }
                s
            }
            Operand::Func(f) => f.clone(),
            Operand::Str(s) => format!("{s:?}"),
            Operand::Int(i) => i.to_string(),
            Operand::Float(f) => f.to_string(),
            Operand::Bool(b) => b.to_string(),
            Operand::Nil => "nil".into(),
            Operand::Sub(_, f) => {
                let mut s = "(...)".to_string();
                for x in f {
                    s.push('.');
                    s.push_str(x);
                }
                s
            }
        }
    }
}

/// The parse of one source file: its top-level body and the templates it defines.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub body: Vec<Node>,
    pub defines: BTreeMap<String, Vec<Node>>,
}

// ---------------------------------------------------------------- lexing

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Dot,
    Field(String),
    Var(String),
    Ident(String),
    Str(String),
    Int(i64),
    Float(f64),
    Char(i64),
    LParen,
    RParen,
    Pipe,
    Declare,
    Assign,
    Comma,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    /// Whitespace precedes it (separates operands; a field chain must be adjacent).
    spaced: bool,
}

/// A text run or an action's tokens, after trim markers are applied.
#[derive(Debug)]
enum Item {
    Text(String),
    Action { line: usize, toks: Vec<Token> },
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

struct Lexer<'a> {
    name: &'a str,
    src: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn line_at(&self, pos: usize) -> usize {
        self.src[..pos.min(self.src.len())].matches('\n').count() + 1
    }

    fn err(&self, pos: usize, msg: impl Into<String>) -> TemplateError {
        TemplateError::Parse {
            template: self.name.to_string(),
            line: self.line_at(pos),
            msg: msg.into(),
        }
    }

    fn items(mut self) -> Result<Vec<Item>, TemplateError> {
        let mut items = Vec::new();
        let mut trim_next_text = false;
        loop {
            let rest = &self.src[self.pos..];
            let Some(open) = rest.find("{{") else {
                let mut text = rest.to_string();
                if trim_next_text {
                    text = text.trim_start_matches(is_space).to_string();
                }
                if !text.is_empty() {
                    items.push(Item::Text(text));
                }
                return Ok(items);
            };
            let mut text = rest[..open].to_string();
            if trim_next_text {
                text = text.trim_start_matches(is_space).to_string();
            }
            let action_start = self.pos + open;
            let mut p = action_start + 2;
            let after = &self.src[p..];
            let mut chars = after.chars();
            let left_trim = chars.next() == Some('-') && chars.next().is_some_and(is_space);
            if left_trim {
                text = text.trim_end_matches(is_space).to_string();
                p += 2;
            }
            if !text.is_empty() {
                items.push(Item::Text(text));
            }
            let line = self.line_at(action_start);
            // Comments: `{{/*` or `{{- /*` directly.
            if self.src[p..].starts_with("/*") {
                let Some(close) = self.src[p..].find("*/") else {
                    return Err(self.err(action_start, "unclosed comment"));
                };
                let mut q = p + close + 2;
                let tail = &self.src[q..];
                if tail.starts_with("}}") {
                    trim_next_text = false;
                    q += 2;
                } else if tail.len() >= 4
                    && tail.starts_with(|c: char| is_space(c))
                    && tail[1..].starts_with("-}}")
                {
                    trim_next_text = true;
                    q += 4;
                } else {
                    return Err(self.err(q, "comment ends before closing delimiter"));
                }
                self.pos = q;
                continue;
            }
            let (toks, end, right_trim) = self.action_tokens(p)?;
            trim_next_text = right_trim;
            self.pos = end;
            items.push(Item::Action { line, toks });
        }
    }

    /// Tokens from `start` to the closing delimiter; returns them, the position after the
    /// delimiter, and whether it was the trimming form ` -}}`.
    fn action_tokens(&self, start: usize) -> Result<(Vec<Token>, usize, bool), TemplateError> {
        let src = self.src;
        let bytes = src.as_bytes();
        let mut i = start;
        let mut toks = Vec::new();
        let mut spaced = true;
        loop {
            if i >= src.len() {
                return Err(self.err(start, "unclosed action"));
            }
            let c = src[i..].chars().next().unwrap_or(' ');
            if is_space(c) {
                // ` -}}` closes with a trim.
                if src[i + 1..].starts_with("-}}") {
                    return Ok((toks, i + 4, true));
                }
                spaced = true;
                i += c.len_utf8();
                continue;
            }
            if src[i..].starts_with("}}") {
                return Ok((toks, i + 2, false));
            }
            let at = i;
            let tok = match c {
                '(' => {
                    i += 1;
                    Tok::LParen
                }
                ')' => {
                    i += 1;
                    Tok::RParen
                }
                '|' => {
                    i += 1;
                    Tok::Pipe
                }
                ',' => {
                    i += 1;
                    Tok::Comma
                }
                '=' => {
                    i += 1;
                    Tok::Assign
                }
                ':' => {
                    if bytes.get(i + 1) == Some(&b'=') {
                        i += 2;
                        Tok::Declare
                    } else {
                        return Err(self.err(at, "expected :="));
                    }
                }
                '"' => {
                    let (s, n) = self.quoted(i)?;
                    i = n;
                    Tok::Str(s)
                }
                '`' => {
                    let Some(close) = src[i + 1..].find('`') else {
                        return Err(self.err(at, "unterminated raw quoted string"));
                    };
                    let s = src[i + 1..i + 1 + close].to_string();
                    i += close + 2;
                    Tok::Str(s)
                }
                '\'' => {
                    let (s, n) = self.quoted(i)?;
                    i = n;
                    let mut cs = s.chars();
                    match (cs.next(), cs.next()) {
                        (Some(ch), None) => Tok::Char(ch as i64),
                        _ => return Err(self.err(at, "malformed character constant")),
                    }
                }
                '$' => {
                    let n = ident_end(src, i + 1);
                    let name = src[i..n].to_string();
                    i = n;
                    Tok::Var(name)
                }
                '.' => {
                    // `.5` is a number; `.Name` a field; `.` alone dot.
                    if bytes.get(i + 1).is_some_and(|b| b.is_ascii_digit()) {
                        let (t, n) = self.number(i)?;
                        i = n;
                        t
                    } else {
                        let n = ident_end(src, i + 1);
                        if n == i + 1 {
                            i += 1;
                            Tok::Dot
                        } else {
                            let name = src[i + 1..n].to_string();
                            i = n;
                            Tok::Field(name)
                        }
                    }
                }
                c if c.is_ascii_digit() || c == '-' || c == '+' => {
                    let (t, n) = self.number(i)?;
                    i = n;
                    t
                }
                c if c.is_alphabetic() || c == '_' => {
                    let n = ident_end(src, i);
                    let name = src[i..n].to_string();
                    i = n;
                    Tok::Ident(name)
                }
                other => {
                    return Err(self.err(at, format!("unexpected {other:?} in command")));
                }
            };
            toks.push(Token { tok, spaced });
            spaced = false;
        }
    }

    fn number(&self, start: usize) -> Result<(Tok, usize), TemplateError> {
        let src = self.src;
        let mut end = start;
        for (off, ch) in src[start..].char_indices() {
            let ok = ch.is_ascii_alphanumeric()
                || ch == '.'
                || ch == '_'
                || ((ch == '-' || ch == '+')
                    && (off == 0
                        || matches!(src.as_bytes()[start + off - 1], b'e' | b'E' | b'p' | b'P')));
            if !ok {
                break;
            }
            end = start + off + ch.len_utf8();
        }
        let text: String = src[start..end].chars().filter(|c| *c != '_').collect();
        let (neg, digits) = match text.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, text.strip_prefix('+').unwrap_or(&text)),
        };
        let int = if let Some(h) = digits
            .strip_prefix("0x")
            .or_else(|| digits.strip_prefix("0X"))
        {
            i64::from_str_radix(h, 16).ok()
        } else if let Some(o) = digits
            .strip_prefix("0o")
            .or_else(|| digits.strip_prefix("0O"))
        {
            i64::from_str_radix(o, 8).ok()
        } else if let Some(b) = digits
            .strip_prefix("0b")
            .or_else(|| digits.strip_prefix("0B"))
        {
            i64::from_str_radix(b, 2).ok()
        } else if digits.len() > 1
            && digits.starts_with('0')
            && digits.bytes().all(|b| b.is_ascii_digit())
        {
            i64::from_str_radix(&digits[1..], 8).ok()
        } else {
            digits.parse::<i64>().ok()
        };
        if let Some(v) = int {
            return Ok((Tok::Int(if neg { -v } else { v }), end));
        }
        match digits.parse::<f64>() {
            Ok(f) if !digits.is_empty() => Ok((Tok::Float(if neg { -f } else { f }), end)),
            _ => Err(self.err(start, format!("bad number syntax: {:?}", &src[start..end]))),
        }
    }

    /// A double- or single-quoted literal with Go escapes; returns it and the end position.
    fn quoted(&self, start: usize) -> Result<(String, usize), TemplateError> {
        let src = self.src;
        let q = src.as_bytes()[start] as char;
        let mut out = String::new();
        let mut it = src[start + 1..].char_indices();
        while let Some((off, c)) = it.next() {
            match c {
                c if c == q => return Ok((out, start + 1 + off + 1)),
                '\n' => break,
                '\\' => {
                    let Some((_, e)) = it.next() else { break };
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        'a' => out.push('\x07'),
                        'b' => out.push('\x08'),
                        'f' => out.push('\x0c'),
                        'v' => out.push('\x0b'),
                        '\\' => out.push('\\'),
                        '"' => out.push('"'),
                        '\'' => out.push('\''),
                        'x' | 'u' | 'U' => {
                            let n = match e {
                                'x' => 2,
                                'u' => 4,
                                _ => 8,
                            };
                            let mut hex = String::new();
                            for _ in 0..n {
                                if let Some((_, h)) = it.next() {
                                    hex.push(h);
                                }
                            }
                            let v = u32::from_str_radix(&hex, 16)
                                .map_err(|_| self.err(start, "invalid escape in string"))?;
                            out.push(
                                char::from_u32(v)
                                    .ok_or_else(|| self.err(start, "invalid escape in string"))?,
                            );
                        }
                        d if d.is_digit(8) => {
                            let mut oct = String::from(d);
                            for _ in 0..2 {
                                if let Some((_, h)) = it.next() {
                                    oct.push(h);
                                }
                            }
                            let v = u32::from_str_radix(&oct, 8)
                                .map_err(|_| self.err(start, "invalid escape in string"))?;
                            out.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                        }
                        other => {
                            return Err(
                                self.err(start, format!("unknown escape sequence \\{other}"))
                            )
                        }
                    }
                }
                c => out.push(c),
            }
        }
        Err(self.err(start, "unterminated quoted string"))
    }
}

fn ident_end(src: &str, from: usize) -> usize {
    let mut end = from;
    for (off, ch) in src[from..].char_indices() {
        if ch.is_alphanumeric() || ch == '_' {
            end = from + off + ch.len_utf8();
        } else {
            break;
        }
    }
    end
}

// ---------------------------------------------------------------- parsing

const KEYWORDS: &[&str] = &[
    "if", "else", "end", "range", "with", "define", "template", "block", "break", "continue",
];

/// How a list of nodes ended.
enum Terminator {
    Eof,
    End,
    Else { line: usize, rest: Vec<Token> },
}

struct Parser<'a> {
    name: &'a str,
    items: std::vec::IntoIter<Item>,
    defines: BTreeMap<String, Vec<Node>>,
    is_func: &'a dyn Fn(&str) -> bool,
    range_depth: usize,
}

/// Parses one source file. `is_func` says which identifiers are functions.
pub(crate) fn parse(
    name: &str,
    src: &str,
    is_func: &dyn Fn(&str) -> bool,
) -> Result<Parsed, TemplateError> {
    let items = Lexer { name, src, pos: 0 }.items()?;
    let mut p = Parser {
        name,
        items: items.into_iter(),
        defines: BTreeMap::new(),
        is_func,
        range_depth: 0,
    };
    let (body, term) = p.list(true)?;
    match term {
        Terminator::Eof => Ok(Parsed {
            body,
            defines: p.defines,
        }),
        Terminator::End => Err(p.err(0, "unexpected {{end}}")),
        Terminator::Else { line, .. } => Err(p.err(line, "unexpected {{else}}")),
    }
}

impl Parser<'_> {
    fn err(&self, line: usize, msg: impl Into<String>) -> TemplateError {
        TemplateError::Parse {
            template: self.name.to_string(),
            line,
            msg: msg.into(),
        }
    }

    fn list(&mut self, top: bool) -> Result<(Vec<Node>, Terminator), TemplateError> {
        let mut nodes = Vec::new();
        while let Some(item) = self.items.next() {
            match item {
                Item::Text(t) => nodes.push(Node::Text(t)),
                Item::Action { line, toks } => {
                    if toks.is_empty() {
                        return Err(self.err(line, "missing value for command"));
                    }
                    let kw = match &toks[0].tok {
                        Tok::Ident(k) if KEYWORDS.contains(&k.as_str()) => k.clone(),
                        _ => {
                            let pipe = self.pipeline(line, &toks, true)?;
                            nodes.push(Node::Action { line, pipe });
                            continue;
                        }
                    };
                    let rest = toks[1..].to_vec();
                    match kw.as_str() {
                        "end" => {
                            if !rest.is_empty() {
                                return Err(self.err(line, "unexpected tokens after end"));
                            }
                            return Ok((nodes, Terminator::End));
                        }
                        "else" => return Ok((nodes, Terminator::Else { line, rest })),
                        "if" | "with" | "range" => nodes.push(self.control(&kw, line, &rest)?),
                        "define" => {
                            if !top {
                                return Err(self.err(line, "define not at top level"));
                            }
                            let name = self.template_name(line, &rest, false)?.0;
                            let (body, term) = self.list(false)?;
                            if !matches!(term, Terminator::End) {
                                return Err(self.err(line, "define without matching end"));
                            }
                            self.defines.insert(name, body);
                        }
                        "block" => {
                            let (name, pipe) = self.template_name(line, &rest, true)?;
                            let (body, term) = self.list(false)?;
                            if !matches!(term, Terminator::End) {
                                return Err(self.err(line, "block without matching end"));
                            }
                            self.defines.insert(name.clone(), body);
                            nodes.push(Node::Template { line, name, pipe });
                        }
                        "template" => {
                            let (name, pipe) = self.template_name(line, &rest, true)?;
                            nodes.push(Node::Template { line, name, pipe });
                        }
                        "break" | "continue" => {
                            if self.range_depth == 0 {
                                return Err(
                                    self.err(line, format!("{{{{{kw}}}}} outside {{{{range}}}}"))
                                );
                            }
                            if !rest.is_empty() {
                                return Err(self.err(line, format!("unexpected tokens after {kw}")));
                            }
                            nodes.push(if kw == "break" {
                                Node::Break
                            } else {
                                Node::Continue
                            });
                        }
                        _ => return Err(self.err(line, format!("unexpected keyword {kw}"))),
                    }
                }
            }
        }
        Ok((nodes, Terminator::Eof))
    }

    fn template_name(
        &self,
        line: usize,
        toks: &[Token],
        with_pipe: bool,
    ) -> Result<(String, Option<Pipe>), TemplateError> {
        let Some(Token {
            tok: Tok::Str(name),
            ..
        }) = toks.first()
        else {
            return Err(self.err(line, "template name must be a string constant"));
        };
        if toks.len() == 1 {
            return Ok((name.clone(), None));
        }
        if !with_pipe {
            return Err(self.err(line, "unexpected tokens after define name"));
        }
        Ok((name.clone(), Some(self.pipeline(line, &toks[1..], false)?)))
    }

    fn control(&mut self, kw: &str, line: usize, toks: &[Token]) -> Result<Node, TemplateError> {
        let pipe = self.pipeline(line, toks, kw == "range")?;
        if kw == "range" {
            self.range_depth += 1;
        }
        let body = self.list(false);
        if kw == "range" {
            self.range_depth -= 1;
        }
        let (body, term) = body?;
        let els = match term {
            Terminator::Eof => return Err(self.err(line, format!("unexpected EOF in {kw}"))),
            Terminator::End => None,
            Terminator::Else { line: el, rest } => {
                let chained = match rest.first().map(|t| &t.tok) {
                    Some(Tok::Ident(k)) if (k == "if" || k == "with") && kw == k => Some(k.clone()),
                    Some(Tok::Ident(k)) if k == "if" || k == "with" => {
                        return Err(self.err(el, format!("else {k} inside {kw}")))
                    }
                    Some(_) => return Err(self.err(el, "unexpected tokens after else")),
                    None => None,
                };
                match chained {
                    // `else if` / `else with`: a nested node that consumes the final end.
                    Some(k) => Some(vec![self.control(&k, el, &rest[1..])?]),
                    None => {
                        let (els, term) = self.list(false)?;
                        if !matches!(term, Terminator::End) {
                            return Err(self.err(el, format!("expected end after else in {kw}")));
                        }
                        Some(els)
                    }
                }
            }
        };
        Ok(match kw {
            "if" => Node::If {
                line,
                pipe,
                then: body,
                els,
            },
            "with" => Node::With {
                line,
                pipe,
                body,
                els,
            },
            _ => Node::Range {
                line,
                pipe,
                body,
                els,
            },
        })
    }

    /// A pipeline from tokens; `allow_two_vars` for range's `$i, $v :=`.
    fn pipeline(
        &self,
        line: usize,
        toks: &[Token],
        allow_decl: bool,
    ) -> Result<Pipe, TemplateError> {
        let mut pos = 0;
        let mut decl = Vec::new();
        let mut assign = false;
        // Declaration: `$x :=`, `$x =`, `$i, $v :=`.
        if let Some(Tok::Var(v)) = toks.first().map(|t| &t.tok) {
            match toks.get(1).map(|t| &t.tok) {
                Some(Tok::Declare) | Some(Tok::Assign) => {
                    assign = matches!(toks[1].tok, Tok::Assign);
                    decl.push(v.clone());
                    pos = 2;
                }
                Some(Tok::Comma) => {
                    if let (Some(Tok::Var(v2)), Some(op)) =
                        (toks.get(2).map(|t| &t.tok), toks.get(3).map(|t| &t.tok))
                    {
                        if !allow_decl || !matches!(op, Tok::Declare | Tok::Assign) {
                            return Err(self.err(line, "too many declarations"));
                        }
                        assign = matches!(op, Tok::Assign);
                        decl.push(v.clone());
                        decl.push(v2.clone());
                        pos = 4;
                    } else {
                        return Err(self.err(line, "bad declaration syntax"));
                    }
                }
                _ => {}
            }
        }
        let (cmds, end) = self.commands(line, toks, pos, false)?;
        if end != toks.len() {
            return Err(self.err(line, "unexpected ) in operand"));
        }
        if cmds.is_empty() {
            return Err(self.err(line, "missing value for command"));
        }
        Ok(Pipe { decl, assign, cmds })
    }

    /// Commands separated by `|`, up to the end or (when `in_paren`) a `)`.
    fn commands(
        &self,
        line: usize,
        toks: &[Token],
        mut pos: usize,
        in_paren: bool,
    ) -> Result<(Vec<Command>, usize), TemplateError> {
        let mut cmds = Vec::new();
        let mut args = Vec::new();
        while pos < toks.len() {
            match &toks[pos].tok {
                Tok::Pipe => {
                    if args.is_empty() {
                        return Err(self.err(line, "missing command before |"));
                    }
                    cmds.push(Command {
                        args: std::mem::take(&mut args),
                    });
                    pos += 1;
                }
                Tok::RParen => {
                    if !in_paren {
                        return Err(self.err(line, "unexpected right paren"));
                    }
                    break;
                }
                _ => {
                    if !args.is_empty()
                        && !toks[pos].spaced
                        && !matches!(toks[pos].tok, Tok::LParen)
                    {
                        return Err(self.err(line, "missing space between operands"));
                    }
                    let (op, n) = self.operand(line, toks, pos)?;
                    args.push(op);
                    pos = n;
                }
            }
        }
        if !args.is_empty() {
            cmds.push(Command { args });
        } else if !cmds.is_empty() {
            return Err(self.err(line, "missing command after |"));
        }
        Ok((cmds, pos))
    }

    fn operand(
        &self,
        line: usize,
        toks: &[Token],
        pos: usize,
    ) -> Result<(Operand, usize), TemplateError> {
        let mut next = pos + 1;
        let base = match &toks[pos].tok {
            Tok::Dot => Operand::Dot,
            Tok::Field(f) => {
                let mut chain = vec![f.clone()];
                while let Some(Token {
                    tok: Tok::Field(g),
                    spaced: false,
                }) = toks.get(next)
                {
                    chain.push(g.clone());
                    next += 1;
                }
                return Ok((Operand::Field(chain), next));
            }
            Tok::Var(v) => Operand::Var(v.clone(), Vec::new()),
            Tok::Ident(name) => match name.as_str() {
                "true" => Operand::Bool(true),
                "false" => Operand::Bool(false),
                "nil" => Operand::Nil,
                n if KEYWORDS.contains(&n) => {
                    return Err(self.err(line, format!("unexpected keyword {n} in operand")))
                }
                n if (self.is_func)(n) => Operand::Func(n.to_string()),
                n => return Err(self.err(line, format!("function {n:?} not defined"))),
            },
            Tok::Str(s) => Operand::Str(s.clone()),
            Tok::Int(i) | Tok::Char(i) => Operand::Int(*i),
            Tok::Float(f) => Operand::Float(*f),
            Tok::LParen => {
                let (cmds, end) = self.commands(line, toks, pos + 1, true)?;
                if !matches!(toks.get(end).map(|t| &t.tok), Some(Tok::RParen)) {
                    return Err(self.err(line, "unclosed left paren"));
                }
                if cmds.is_empty() {
                    return Err(self.err(line, "missing value for parenthesized pipeline"));
                }
                next = end + 1;
                Operand::Sub(
                    Box::new(Pipe {
                        decl: Vec::new(),
                        assign: false,
                        cmds,
                    }),
                    Vec::new(),
                )
            }
            other => return Err(self.err(line, format!("unexpected {other:?} in operand"))),
        };
        // Field chains directly after a variable or a parenthesized pipeline.
        let mut chain = Vec::new();
        while let Some(Token {
            tok: Tok::Field(g),
            spaced: false,
        }) = toks.get(next)
        {
            chain.push(g.clone());
            next += 1;
        }
        if chain.is_empty() {
            return Ok((base, next));
        }
        match base {
            Operand::Var(v, _) => Ok((Operand::Var(v, chain), next)),
            Operand::Sub(p, _) => Ok((Operand::Sub(p, chain), next)),
            Operand::Dot => Err(self.err(line, "unexpected . after term")),
            other => Err(self.err(line, format!("unexpected field after {}", other.describe()))),
        }
    }
}
