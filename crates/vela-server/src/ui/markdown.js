// Markdown to safe HTML for the chat page, and a small code highlighter.
//
// Safety: every piece of model text goes through esc() before it reaches the output; the only
// tags emitted are the ones written here, and links are made only for http(s) URLs. Unclosed
// constructs (a code fence still streaming) render as far as they go.
'use strict';

(function () {
  const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

  /** HTML-escape text (also safe inside double- or single-quoted attributes). */
  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ESC[c]);
  }

  // ---------------------------------------------------------------- code highlighting

  const words = (s) => new Set(s.split(/\s+/).filter(Boolean));

  const JS_KW =
    'break case catch class const continue debugger default delete do else export extends ' +
    'finally for function if import in instanceof let new of return super switch this throw ' +
    'try typeof var void while with yield async await static get set null undefined true ' +
    'false NaN Infinity from';
  const C_KW =
    'auto break case char const continue default do double else enum extern float for goto if ' +
    'inline int long register return short signed sizeof static struct switch typedef union ' +
    'unsigned void volatile while bool true false NULL nullptr class namespace template ' +
    'typename public private protected virtual override new delete this using std size_t ' +
    'include define ifdef ifndef endif pragma constexpr noexcept';

  // Per language: keywords, line-comment starts, a block comment, string quotes, whether
  // triple quotes open strings (Python) and whether `#` comments need a space before (shell).
  const LANGS = {
    js: { kw: words(JS_KW), line: ['//'], block: ['/*', '*/'], quotes: '"\'`' },
    ts: {
      kw: words(JS_KW + ' interface type enum implements private public protected readonly ' +
        'declare namespace abstract as keyof any number string boolean never unknown'),
      line: ['//'], block: ['/*', '*/'], quotes: '"\'`',
    },
    python: {
      kw: words('False None True and as assert async await break class continue def del elif ' +
        'else except finally for from global if import in is lambda nonlocal not or pass raise ' +
        'return try while with yield self match case print len range int str float list dict ' +
        'set tuple bool'),
      line: ['#'], quotes: '"\'', triple: true,
    },
    rust: {
      kw: words('as async await break const continue crate dyn else enum extern false fn for if ' +
        'impl in let loop match mod move mut pub ref return self Self static struct super trait ' +
        'true type unsafe use where while Some None Ok Err Box Vec String Option Result i8 i16 ' +
        'i32 i64 i128 isize u8 u16 u32 u64 u128 usize f32 f64 bool char str'),
      line: ['//'], block: ['/*', '*/'], quotes: '"', charQuote: true,
    },
    c: { kw: words(C_KW), line: ['//'], block: ['/*', '*/'], quotes: '"\'' },
    java: {
      kw: words('abstract assert boolean break byte case catch char class const continue default ' +
        'do double else enum extends final finally float for if implements import instanceof int ' +
        'interface long native new package private protected public return short static super ' +
        'switch synchronized this throw throws try void volatile while true false null var ' +
        'record String'),
      line: ['//'], block: ['/*', '*/'], quotes: '"\'',
    },
    go: {
      kw: words('break case chan const continue default defer else fallthrough for func go goto ' +
        'if import interface map package range return select struct switch type var true false ' +
        'nil iota int int8 int16 int32 int64 uint uint8 uint16 uint32 uint64 float32 float64 ' +
        'string bool byte rune error make len cap append new panic'),
      line: ['//'], block: ['/*', '*/'], quotes: '"\'`',
    },
    bash: {
      kw: words('if then else elif fi for while until do done case esac function in return local ' +
        'export echo exit set unset readonly shift source cd sudo true false'),
      line: ['#'], quotes: '"\'', hashNeedsSpace: true,
    },
    json: { kw: words('true false null'), quotes: '"' },
    sql: {
      kw: words('select from where and or not insert into values update set delete create table ' +
        'drop alter index primary key foreign references join left right inner outer on group ' +
        'by order having limit offset as distinct null is in like between union all case when ' +
        'then else end count sum avg min max integer text varchar'),
      line: ['--'], block: ['/*', '*/'], quotes: '\'"', noCase: true,
    },
    css: { kw: words('important'), block: ['/*', '*/'], quotes: '"\'' },
    yaml: { kw: words('true false null yes no'), line: ['#'], quotes: '"\'', hashNeedsSpace: true },
    html: { kw: new Set(), block: ['<!--', '-->'], quotes: '"' },
  };
  const ALIAS = {
    javascript: 'js', jsx: 'js', mjs: 'js', node: 'js', typescript: 'ts', tsx: 'ts',
    py: 'python', python3: 'python', rs: 'rust', sh: 'bash', shell: 'bash', zsh: 'bash',
    console: 'bash', 'c++': 'c', cpp: 'c', cc: 'c', h: 'c', hpp: 'c', cs: 'java', csharp: 'java',
    kotlin: 'java', golang: 'go', yml: 'yaml', toml: 'yaml', xml: 'html', svg: 'html',
    postgres: 'sql', sqlite: 'sql', mysql: 'sql', scss: 'css',
  };

  const NUM = /0[xX][0-9a-fA-F_]+|0[bB][01_]+|\d[\d_]*(?:\.\d[\d_]*)?(?:[eE][+-]?\d+)?/y;
  const IDENT = /[A-Za-z_$][\w$]*/y;

  const span = (cls, text) => '<span class="tk-' + cls + '">' + esc(text) + '</span>';

  /** Highlighted HTML of `code` in `lang` (unknown languages: strings and numbers only). */
  function highlight(code, lang) {
    const key = String(lang || '').toLowerCase();
    const L = LANGS[ALIAS[key] || key] || { kw: new Set(), quotes: '"' };
    let out = '';
    let plain = '';
    const flush = () => { out += esc(plain); plain = ''; };
    const n = code.length;
    let i = 0;
    while (i < n) {
      const c = code[i];
      const prev = i > 0 ? code[i - 1] : '\n';
      // Comments.
      if (L.block && code.startsWith(L.block[0], i)) {
        let end = code.indexOf(L.block[1], i + L.block[0].length);
        end = end < 0 ? n : end + L.block[1].length;
        flush(); out += span('c', code.slice(i, end)); i = end; continue;
      }
      if (L.line && L.line.some((s) => code.startsWith(s, i)) &&
          !(L.hashNeedsSpace && !/\s/.test(prev))) {
        let end = code.indexOf('\n', i);
        if (end < 0) end = n;
        flush(); out += span('c', code.slice(i, end)); i = end; continue;
      }
      // Strings.
      if (L.quotes.includes(c) || (L.charQuote && c === "'")) {
        if (L.charQuote && c === "'" && !/^'(\\.|[^\\'\n])'/.test(code.slice(i, i + 12))) {
          plain += c; i++; continue; // a Rust lifetime, not a char literal
        }
        const q = L.triple && code.startsWith(c + c + c, i) ? c + c + c : c;
        let j = i + q.length;
        while (j < n && !code.startsWith(q, j)) {
          if (code[j] === '\\') j++;
          else if (q.length === 1 && c !== '`' && code[j] === '\n') break;
          j++;
        }
        j = Math.min(n, j + (code.startsWith(q, j) ? q.length : 0));
        flush(); out += span('s', code.slice(i, j)); i = j; continue;
      }
      // Numbers and words.
      if (/[0-9]/.test(c) && !/[\w$]/.test(prev)) {
        NUM.lastIndex = i;
        const m = NUM.exec(code);
        if (m) { flush(); out += span('n', m[0]); i += m[0].length; continue; }
      }
      if (/[A-Za-z_$]/.test(c) && !/[\w$]/.test(prev)) {
        IDENT.lastIndex = i;
        const m = IDENT.exec(code);
        if (m) {
          const w = m[0];
          if (L.kw.has(L.noCase ? w.toLowerCase() : w)) { flush(); out += span('k', w); }
          else if (code[i + w.length] === '(') { flush(); out += span('f', w); }
          else plain += w;
          i += w.length; continue;
        }
      }
      plain += c; i++;
    }
    flush();
    return out;
  }

  // ---------------------------------------------------------------- inline

  /**
   * Inline Markdown of one block's text: code spans, links (http/https only), bare URLs, bold,
   * italic, strikethrough. Pieces that are already HTML are kept aside as \u0000N\u0000 slots
   * so the escaping and emphasis passes never touch them.
   */
  function inline(text, noLinks) {
    const slots = [];
    const keep = (html) => '\u0000' + (slots.push(html) - 1) + '\u0000';
    let t = String(text).replace(/\u0000/g, '');
    t = t.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (m, ticks, code) => {
      const body = /^ .* $/.test(code) && code.trim() ? code.slice(1, -1) : code;
      return keep('<code>' + esc(body) + '</code>');
    });
    if (!noLinks) {
      t = t.replace(/\[([^\]\n]+)\]\(\s*<?([^\s()<>]+)>?(?:\s+"[^"]*")?\s*\)/g, (m, label, url) => {
        if (!/^https?:\/\/[^\s]+$/i.test(url)) return m;
        return keep('<a href="' + esc(url) + '" target="_blank" rel="noopener noreferrer">' +
          inline(label, true) + '</a>');
      });
      t = t.replace(/<?(https?:\/\/[^\s<>"'`\u0000]*[^\s<>"'`\u0000.,;:!?)\]*_])>?/gi, (m, url) =>
        keep('<a href="' + esc(url) + '" target="_blank" rel="noopener noreferrer">' + esc(url) +
          '</a>'));
    }
    t = esc(t);
    t = t.replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, '<strong>$1</strong>');
    t = t.replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, '$1<strong>$2</strong>');
    t = t.replace(/(^|[^*\w\\])\*(?=[^\s*])([^*\n]*?[^\s*\\])\*(?![*\w])/g, '$1<em>$2</em>');
    t = t.replace(/(^|[^\w\\])_(?=[^\s_])([^_\n]*?[^\s_\\])_(?!\w)/g, '$1<em>$2</em>');
    t = t.replace(/~~(?=\S)([\s\S]*?\S)~~/g, '<del>$1</del>');
    t = t.replace(/\\([\\`*_{}[\]()#+\-.!|~>])/g, '$1');
    return t.replace(/\u0000(\d+)\u0000/g, (m, k) => slots[+k]);
  }

  // ---------------------------------------------------------------- blocks

  const FENCE = /^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`{]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
  const HR = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}>/;
  const LIST = /^( *)([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$/;
  const TSEP = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
  const blank = (l) => /^\s*$/.test(l);

  function isTable(lines, i) {
    const next = lines[i + 1];
    return next !== undefined && lines[i].includes('|') && TSEP.test(next) &&
      (next.includes('|') || /\|/.test(lines[i].trim().slice(1, -1)));
  }

  /** Whether line i starts a block that ends a paragraph. */
  function startsBlock(lines, i) {
    const l = lines[i];
    return FENCE.test(l) || HEADING.test(l) || HR.test(l) || QUOTE.test(l) ||
      (LIST.test(l) && !blank(l.replace(LIST, '$4'))) || isTable(lines, i);
  }

  function codeBlock(code, lang) {
    const label = String(lang || '').replace(/[^\w+#.-]/g, '').slice(0, 24);
    return '<div class="code"><div class="code-head"><span class="lang">' +
      esc(label || 'text') + '</span><button type="button" class="copy">Copy</button></div>' +
      '<pre><code>' + highlight(code, label) + '</code></pre></div>';
  }

  function splitRow(l) {
    let s = l.trim();
    if (s.startsWith('|')) s = s.slice(1);
    if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
    return s.split(/(?<!\\)\|/).map((c) => c.trim());
  }

  function table(lines, i, out) {
    const head = splitRow(lines[i]);
    const align = splitRow(lines[i + 1]).map((c) =>
      c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : '');
    const cell = (tag, c, k) => '<' + tag + (align[k] ? ' class="al-' + align[k] + '"' : '') +
      '>' + inline(c) + '</' + tag + '>';
    let html = '<div class="table"><table><thead><tr>' +
      head.map((c, k) => cell('th', c, k)).join('') + '</tr></thead><tbody>';
    i += 2;
    while (i < lines.length && !blank(lines[i]) && lines[i].includes('|')) {
      const row = splitRow(lines[i]);
      html += '<tr>' + head.map((_, k) => cell('td', row[k] || '', k)).join('') + '</tr>';
      i++;
    }
    out.push(html + '</tbody></table></div>');
    return i;
  }

  function list(lines, i, out) {
    const first = LIST.exec(lines[i]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const items = [];
    let cur = null;
    let contentIndent = 0;
    let sawBlank = false;
    let loose = false;
    while (i < lines.length) {
      const l = lines[i];
      const m = LIST.exec(l);
      if (m && m[1].length <= indent + 1 && /\d/.test(m[2]) === ordered &&
          !(cur && HR.test(l))) {
        if (cur && sawBlank) loose = true;
        cur = [m[4] || ''];
        items.push(cur);
        contentIndent = m[1].length + m[2].length + Math.min((m[3] || ' ').length, 4);
        sawBlank = false;
        i++;
        continue;
      }
      if (blank(l)) { cur.push(''); sawBlank = true; i++; continue; }
      const ind = l.match(/^ */)[0].length;
      if (ind > indent) {
        if (sawBlank && !(ind >= contentIndent)) break;
        cur.push(l.slice(Math.min(ind, contentIndent)));
        if (sawBlank) loose = true;
        sawBlank = false;
        i++;
        continue;
      }
      if (!sawBlank && !startsBlock(lines, i)) { cur.push(l); i++; continue; } // lazy line
      break;
    }
    const tag = ordered ? 'ol' : 'ul';
    const start = ordered ? parseInt(first[2], 10) : 1;
    let html = '<' + tag + (ordered && start !== 1 ? ' start="' + start + '"' : '') + '>';
    for (const it of items) {
      while (it.length && blank(it[it.length - 1])) it.pop();
      html += '<li>' + blocks(it, !loose) + '</li>';
    }
    out.push(html + '</' + tag + '>');
    return i;
  }

  /** HTML of a list of lines; `tight`: paragraphs without <p> (list items). */
  function blocks(lines, tight) {
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const l = lines[i];
      let m;
      if (blank(l)) { i++; continue; }
      if ((m = FENCE.exec(l))) {
        const fence = m[1];
        const close = new RegExp('^ {0,3}' + (fence[0] === '`' ? '`' : '~') + '{' + fence.length +
          ',}[ \\t]*$');
        const code = [];
        i++;
        while (i < lines.length && !close.test(lines[i])) code.push(lines[i++]);
        i++;
        out.push(codeBlock(code.join('\n'), m[2]));
        continue;
      }
      if ((m = HEADING.exec(l))) {
        const h = m[1].length;
        out.push('<h' + h + '>' + inline(m[2] || '') + '</h' + h + '>');
        i++;
        continue;
      }
      if (HR.test(l)) { out.push('<hr>'); i++; continue; }
      if (QUOTE.test(l)) {
        const q = [];
        while (i < lines.length && QUOTE.test(lines[i])) q.push(lines[i++].replace(/^ {0,3}> ?/, ''));
        out.push('<blockquote>' + blocks(q, false) + '</blockquote>');
        continue;
      }
      if (isTable(lines, i)) { i = table(lines, i, out); continue; }
      if (LIST.test(l)) { i = list(lines, i, out); continue; }
      const para = [l.trim()];
      i++;
      while (i < lines.length && !blank(lines[i]) && !startsBlock(lines, i)) para.push(lines[i++].trim());
      const html = para.map((p) => inline(p)).join('<br>');
      out.push(tight ? html : '<p>' + html + '</p>');
    }
    return out.join('');
  }

  /** Safe HTML of a Markdown text. */
  function render(text) {
    return blocks(String(text || '').replace(/\r\n?/g, '\n').split('\n'), false);
  }

  window.VelaMarkdown = { render, highlight, esc };
})();
