// The chat page of `vela serve`: conversations in localStorage, streaming answers from
// /v1/chat/completions (SSE read by hand from fetch), reasoning and tool calls shown apart from
// the answer, per-message stats, the model from /props, and an API-key form on a 401.
// Every URL is relative, so the page works on whatever host and port serves it.
'use strict';

(function () {
  const MD = window.VelaMarkdown;
  const $ = (id) => document.getElementById(id);
  const KEYS = {
    convs: 'vela.conversations', current: 'vela.current', settings: 'vela.settings',
    apiKey: 'vela.apiKey',
  };
  const NUM_FIELDS = ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed'];
  const INT_FIELDS = new Set(['top_k', 'max_tokens', 'seed']);

  // ------------------------------------------------------------------ storage

  function load(key, fallback) {
    try {
      const v = localStorage.getItem(key);
      return v == null ? fallback : JSON.parse(v);
    } catch (e) {
      return fallback;
    }
  }

  function store(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch (e) {
      notice('Could not save to the browser storage (' + e.message + '); older conversations ' +
        'may need deleting.');
    }
  }

  const str = (v) => (typeof v === 'string' ? v : '');

  /** A stored conversation, checked field by field (storage may hold anything). */
  function cleanConv(c) {
    if (!c || typeof c !== 'object' || typeof c.id !== 'string' || !Array.isArray(c.messages)) {
      return null;
    }
    const messages = c.messages
      .filter((m) => m && (m.role === 'user' || m.role === 'assistant'))
      .map((m) => {
        const x = {
          role: m.role, content: str(m.content), reasoning: str(m.reasoning),
          tools: Array.isArray(m.tools) ? m.tools.filter((t) => t && typeof t === 'object') : [],
          stats: m.stats && typeof m.stats === 'object' ? m.stats : null,
          error: str(m.error), stopped: !!m.stopped,
        };
        // An answer without stats never finished: the page was closed while it streamed.
        if (x.role === 'assistant' && !x.stats && !x.error) x.stopped = true;
        return x;
      });
    return {
      id: c.id, title: str(c.title), auto: c.auto !== false, messages,
      created: +c.created || Date.now(), updated: +c.updated || Date.now(),
    };
  }

  let convs = (Array.isArray(load(KEYS.convs, [])) ? load(KEYS.convs, []) : [])
    .map(cleanConv).filter(Boolean);
  let currentId = str(load(KEYS.current, ''));
  let settings = Object.assign({ system: '' }, load(KEYS.settings, {}));
  let apiKey = str(load(KEYS.apiKey, ''));

  const saveConvs = () => { store(KEYS.convs, convs); store(KEYS.current, currentId); };
  const current = () => convs.find((c) => c.id === currentId) || null;

  // ------------------------------------------------------------------ DOM and HTTP utilities

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function button(text, cls, label) {
    const b = el('button', cls, text);
    b.type = 'button';
    if (label) { b.setAttribute('aria-label', label); b.title = label; }
    return b;
  }

  let noticeTimer = 0;
  function notice(text) {
    const n = $('notice');
    n.textContent = text;
    n.hidden = false;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => { n.hidden = true; }, 6000);
  }

  function authHeaders(extra) {
    const h = Object.assign({}, extra);
    if (apiKey) h.Authorization = 'Bearer ' + apiKey;
    return h;
  }

  /** The message of an error answer: `{"error":{"message"}}` (OpenAI shape) or the raw text. */
  async function errorOf(resp) {
    let text = '';
    try { text = await resp.text(); } catch (e) { /* body unreadable */ }
    let msg = '';
    try {
      const j = JSON.parse(text);
      msg = (j && j.error && (j.error.message || (typeof j.error === 'string' ? j.error : ''))) || '';
    } catch (e) { /* not JSON */ }
    msg = msg || text.trim().slice(0, 500) || resp.statusText || 'request failed';
    return msg + ' (HTTP ' + resp.status + ')';
  }

  const fmtMs = (ms) => (ms >= 10000 ? (ms / 1000).toFixed(1) + ' s' : Math.round(ms) + ' ms');
  const fmtRate = (r) => (r >= 100 ? Math.round(r) : r.toFixed(1)) + ' tok/s';

  function newId() {
    return 'c' + Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  }

  function titleOf(text) {
    const t = text.replace(/\s+/g, ' ').trim();
    return t.length > 48 ? t.slice(0, 47) + '…' : t || 'New chat';
  }

  // ------------------------------------------------------------------ model info and API key

  let keyWanted = false;

  /** Show the model from /props; 'ok', or why not: 'auth' (401), 'loading', 'down', 'error'. */
  async function loadProps() {
    let r;
    try {
      r = await fetch('props', { headers: authHeaders(), cache: 'no-store' });
    } catch (e) {
      setModel('server unreachable', '');
      setTimeout(loadProps, 5000);
      return 'down';
    }
    if (r.status === 401) {
      const why = await errorOf(r);
      setModel('API key needed', '');
      askKey(apiKey ? 'The server rejected this key: ' + why : '');
      return 'auth';
    }
    if (r.status === 503) {
      setModel('the model is loading…', '');
      setTimeout(loadProps, 2000);
      return 'loading';
    }
    if (!r.ok) {
      setModel('error: ' + (await errorOf(r)), '');
      return 'error';
    }
    let p = {};
    try { p = await r.json(); } catch (e) { /* keep defaults */ }
    setModel(str(p.model) || 'model', Number.isFinite(p.n_ctx) ? 'ctx ' + p.n_ctx : '');
    hideKey();
    return 'ok';
  }

  function setModel(name, ctx) {
    $('model-name').textContent = name;
    $('model-ctx').textContent = ctx;
    document.title = name && !/…|needed|error|unreachable/.test(name) ? name + ' · vela' : 'vela chat';
  }

  function askKey(message) {
    keyWanted = true;
    $('auth').hidden = false;
    $('auth-msg').textContent = message || '';
    $('key-input').value = '';
    $('key-input').focus();
  }

  function hideKey() {
    keyWanted = false;
    $('auth').hidden = true;
    $('auth-msg').textContent = '';
  }

  $('auth-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const k = $('key-input').value.trim();
    if (!k) return;
    apiKey = k;
    $('auth-msg').textContent = 'Checking…';
    const got = await loadProps();
    // A refused key is not kept; one the server could not check yet (loading, down) is.
    if (got !== 'auth') store(KEYS.apiKey, k);
    if (got === 'ok') {
      notice('API key accepted.');
      $('input').focus();
    }
  });

  // ------------------------------------------------------------------ settings

  function fillSettings() {
    $('set-system').value = str(settings.system);
    for (const k of NUM_FIELDS) $('set-' + k).value = settings[k] == null ? '' : String(settings[k]);
  }

  function readSettings() {
    settings.system = $('set-system').value;
    for (const k of NUM_FIELDS) {
      const v = $('set-' + k).value.trim();
      if (v === '' || !Number.isFinite(Number(v))) delete settings[k];
      else settings[k] = Number(v);
    }
    store(KEYS.settings, settings);
  }

  function toggleSettings(open) {
    const p = $('settings');
    p.hidden = open === undefined ? !p.hidden : !open;
    $('toggle-settings').setAttribute('aria-expanded', String(!p.hidden));
    if (!p.hidden) $('set-system').focus();
  }

  $('settings-form').addEventListener('input', readSettings);
  $('settings-form').addEventListener('submit', (e) => e.preventDefault());
  $('toggle-settings').addEventListener('click', () => toggleSettings());
  $('settings-close').addEventListener('click', () => { toggleSettings(false); $('input').focus(); });
  $('settings-reset').addEventListener('click', () => {
    settings = { system: '' };
    store(KEYS.settings, settings);
    fillSettings();
  });
  $('key-change').addEventListener('click', () => askKey(''));
  $('key-forget').addEventListener('click', () => {
    apiKey = '';
    try { localStorage.removeItem(KEYS.apiKey); } catch (e) { /* no storage */ }
    notice('API key removed from this browser.');
    loadProps();
  });

  // ------------------------------------------------------------------ conversation list

  function newConv() {
    const c = { id: newId(), title: '', auto: true, messages: [], created: Date.now(), updated: Date.now() };
    convs.push(c);
    currentId = c.id;
    saveConvs();
    return c;
  }

  function renderList() {
    const ul = $('conv-list');
    ul.textContent = '';
    const sorted = convs.slice().sort((a, b) => b.updated - a.updated);
    for (const c of sorted) {
      const li = el('li', 'conv' + (c.id === currentId ? ' current' : ''));
      li.dataset.id = c.id;
      const title = c.title || 'New chat';
      const open = button(title, 'conv-open');
      if (c.id === currentId) open.setAttribute('aria-current', 'true');
      const ren = button('✎', 'conv-rename icon', 'Rename “' + title + '”');
      const del = button('✕', 'conv-delete icon', 'Delete “' + title + '”');
      li.append(open, ren, del);
      ul.append(li);
    }
  }

  function switchTo(id) {
    currentId = id;
    store(KEYS.current, currentId);
    renderList();
    renderConversation();
    closeSidebar();
  }

  function startRename(li, c) {
    const input = el('input', 'conv-title-input');
    input.value = c.title || '';
    input.setAttribute('aria-label', 'Conversation title');
    const open = li.querySelector('.conv-open');
    open.replaceWith(input);
    input.focus();
    input.select();
    let done = false;
    const finish = (keep) => {
      if (done) return;
      done = true;
      const t = input.value.replace(/\s+/g, ' ').trim();
      if (keep && t) { c.title = t.slice(0, 120); c.auto = false; saveConvs(); }
      renderList();
      const again = $('conv-list').querySelector('li[data-id="' + CSS.escape(c.id) + '"] .conv-open');
      if (again) again.focus();
    };
    input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') { e.preventDefault(); finish(true); }
      if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); finish(false); }
    });
    input.addEventListener('blur', () => finish(true));
  }

  function deleteConv(c) {
    if (gen && gen.conv === c) gen.ctrl.abort();
    convs = convs.filter((x) => x !== c);
    if (currentId === c.id) {
      const next = convs.slice().sort((a, b) => b.updated - a.updated)[0];
      currentId = next ? next.id : '';
    }
    saveConvs();
    renderList();
    renderConversation();
    notice('Conversation deleted.');
  }

  $('conv-list').addEventListener('click', (e) => {
    const b = e.target.closest('button');
    const li = e.target.closest('li.conv');
    if (!b || !li) return;
    const c = convs.find((x) => x.id === li.dataset.id);
    if (!c) return;
    if (b.classList.contains('conv-open')) switchTo(c.id);
    else if (b.classList.contains('conv-rename')) startRename(li, c);
    else if (b.classList.contains('conv-delete')) {
      // Two clicks: the first asks, the second deletes.
      if (b.dataset.confirm) { deleteConv(c); return; }
      b.dataset.confirm = '1';
      b.textContent = 'Delete?';
      b.setAttribute('aria-label', 'Confirm: delete “' + (c.title || 'New chat') + '”');
      setTimeout(() => {
        if (!b.isConnected) return;
        delete b.dataset.confirm;
        b.textContent = '✕';
        b.setAttribute('aria-label', 'Delete “' + (c.title || 'New chat') + '”');
      }, 4000);
    }
  });

  $('new-chat').addEventListener('click', () => {
    const c = current();
    if (!c || c.messages.length) newConv();
    renderList();
    renderConversation();
    closeSidebar();
    $('input').focus();
  });

  // Narrow screens: the list slides over the page behind the ☰ button.
  function openSidebar(open) {
    document.body.classList.toggle('side-open', open);
    $('toggle-sidebar').setAttribute('aria-expanded', String(open));
    $('scrim').hidden = !open;
    if (open) {
      const first = $('conv-list').querySelector('[aria-current] , .conv-open') || $('new-chat');
      first.focus();
    }
  }
  const closeSidebar = () => {
    if (document.body.classList.contains('side-open')) openSidebar(false);
  };
  $('toggle-sidebar').addEventListener('click', () =>
    openSidebar(!document.body.classList.contains('side-open')));
  $('scrim').addEventListener('click', () => openSidebar(false));

  // ------------------------------------------------------------------ messages

  /** The DOM of one message (an assistant message's parts are filled by fillAssistant). */
  function messageEl(m) {
    const art = el('article', 'msg ' + m.role);
    art.append(el('div', 'who', m.role === 'user' ? 'You' : 'Assistant'));
    if (m.role === 'user') {
      art.append(el('div', 'text', m.content));
      return art;
    }
    const det = el('details', 'reasoning');
    det.hidden = true;
    det.append(el('summary', '', 'Reasoning'), el('div', 'reasoning-body md'));
    art.append(det, el('div', 'content md'), el('div', 'tools'));
    const err = el('div', 'error');
    err.hidden = true;
    art.append(err, el('div', 'stats'));
    fillAssistant(art, m, false);
    return art;
  }

  function fillAssistant(art, m, streaming) {
    art.dataset.state = streaming ? 'streaming' : m.error ? 'error' : m.stopped ? 'stopped' : 'done';
    const det = art.querySelector('.reasoning');
    if (m.reasoning) {
      if (det.hidden) { det.hidden = false; det.open = streaming; }
      art.querySelector('.reasoning-body').innerHTML = MD.render(m.reasoning);
      det.querySelector('summary').textContent = streaming && !m.content ? 'Reasoning…' : 'Reasoning';
    }
    const content = art.querySelector('.content');
    content.innerHTML = MD.render(m.content);
    content.classList.toggle('cursor', streaming);
    const tools = art.querySelector('.tools');
    tools.textContent = '';
    for (const t of m.tools) {
      if (!t) continue;
      const box = el('div', 'tool');
      const head = el('div', 'tool-head', 'Tool call ');
      head.append(el('code', '', str(t.name) || '(unnamed)'));
      let args = str(t.arguments);
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* partial or not JSON */ }
      const pre = el('pre');
      pre.append(el('code', '', args));
      box.append(head, pre);
      tools.append(box);
    }
    const err = art.querySelector('.error');
    err.hidden = !m.error;
    err.textContent = m.error ? m.error : '';
    err.setAttribute('role', m.error ? 'alert' : 'none');
    renderStats(art.querySelector('.stats'), m, streaming);
  }

  function renderStats(box, m, streaming) {
    box.textContent = '';
    const s = m.stats;
    if (streaming || !s) return;
    const parts = [];
    const add = (text, title) => parts.push([text, title]);
    if (s.prompt_tokens != null) {
      add('prompt ' + s.prompt_tokens + ' tok' + (s.cached_tokens ? ' (' + s.cached_tokens + ' cached)' : ''),
        'prompt tokens (from the prefix cache)');
    }
    if (s.completion_tokens != null) add(s.completion_tokens + ' tok generated', 'completion tokens');
    else if (s.chunks) add('~' + s.chunks + ' chunks received', 'streamed deltas');
    if (s.ttft_ms != null) add('TTFT ' + fmtMs(s.ttft_ms), 'request sent → first token, measured here');
    if (s.prompt_ms != null && s.prompt_per_second) {
      add('prefill ' + fmtMs(s.prompt_ms) + ' (' + fmtRate(s.prompt_per_second) + ')',
        'evaluation of the prompt tokens not found in the cache');
    }
    if (s.predicted_per_second) add('decode ' + fmtRate(s.predicted_per_second), 'generation speed');
    if (s.total_ms != null) add('total ' + fmtMs(s.total_ms), 'request sent → last byte');
    if (m.stopped) add('stopped', 'stopped by you');
    else if (s.finish) add('finish: ' + s.finish, 'finish_reason');
    parts.forEach(([text, title], i) => {
      if (i) box.append(' · ');
      const sp = el('span', '', text);
      sp.title = title;
      box.append(sp);
    });
  }

  function renderConversation() {
    const box = $('messages');
    box.textContent = '';
    const c = current();
    if (!c || !c.messages.length) {
      const e = el('div', 'empty');
      e.append(el('p', '', 'Ask anything.'),
        el('p', 'muted', 'Enter sends · Shift+Enter adds a line · Escape stops an answer'));
      box.append(e);
    } else {
      for (const m of c.messages) {
        const art = messageEl(m);
        if (gen && gen.msg === m) { gen.el = art; fillAssistant(art, m, true); }
        box.append(art);
      }
    }
    box.scrollTop = box.scrollHeight;
  }

  // Copy buttons of code blocks.
  $('messages').addEventListener('click', async (e) => {
    const b = e.target.closest('button.copy');
    if (!b) return;
    const code = b.closest('.code').querySelector('code').textContent;
    let ok = false;
    try {
      if (navigator.clipboard && window.isSecureContext) {
        await navigator.clipboard.writeText(code);
        ok = true;
      }
    } catch (err) { /* fall back below */ }
    if (!ok) {
      const ta = el('textarea');
      ta.value = code;
      document.body.append(ta);
      ta.select();
      try { ok = document.execCommand('copy'); } catch (err) { ok = false; }
      ta.remove();
    }
    b.textContent = ok ? 'Copied' : 'Copy failed';
    setTimeout(() => { b.textContent = 'Copy'; }, 1500);
  });

  // ------------------------------------------------------------------ chat requests

  let gen = null; // the answer streaming now: {conv, msg, el, ctrl, t0, frame, last, saved, stats}

  /** The request's messages: the system prompt and the turns that got an answer. */
  function history(c, upto) {
    const out = [];
    if (str(settings.system).trim()) out.push({ role: 'system', content: settings.system });
    const msgs = c.messages.slice(0, upto);
    for (let i = 0; i < msgs.length; i++) {
      const m = msgs[i];
      const reply = msgs[i + 1];
      if (m.role === 'user') {
        // A turn whose answer failed or was stopped before any text is not sent again.
        if (reply && reply.role === 'assistant' && !reply.content) { i++; continue; }
        out.push({ role: 'user', content: m.content });
      } else if (m.content) {
        out.push({ role: 'assistant', content: m.content });
      }
    }
    return out;
  }

  function requestBody(c, upto) {
    const body = {
      messages: history(c, upto), stream: true, stream_options: { include_usage: true },
    };
    for (const k of NUM_FIELDS) {
      const v = settings[k];
      if (typeof v !== 'number' || !Number.isFinite(v)) continue;
      body[k] = INT_FIELDS.has(k) ? Math.trunc(v) : v;
    }
    return body;
  }

  function setBusy(busy) {
    $('send').disabled = busy;
    $('stop').hidden = !busy;
    $('messages').setAttribute('aria-busy', String(busy));
  }

  /** Repaint the streaming message once per frame at most (bigger texts less often). */
  function schedule() {
    const g = gen;
    if (!g || g.frame) return;
    g.frame = requestAnimationFrame(() => {
      g.frame = 0;
      const now = performance.now();
      const wait = g.msg.content.length > 20000 ? 120 : 0;
      if (now - g.last < wait) { schedule(); return; }
      g.last = now;
      paint(g);
      // What has streamed so far survives a closed page.
      if (now - g.saved > 3000) { g.saved = now; saveConvs(); }
    });
  }

  function paint(g) {
    if (!g.el || !g.el.isConnected || g.conv.id !== currentId) return;
    const box = $('messages');
    const pinned = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    fillAssistant(g.el, g.msg, gen === g);
    if (pinned) box.scrollTop = box.scrollHeight;
  }

  /** Apply one SSE line; true at `data: [DONE]`. */
  function onLine(g, line) {
    if (!line || line[0] === ':') return false; // event end, or a comment (`: keepalive`)
    if (!line.startsWith('data:')) return false; // `event:`, `id:`, `retry:` are not used here
    const data = line.slice(5).replace(/^ /, '');
    if (data === '[DONE]') return true;
    let j;
    try { j = JSON.parse(data); } catch (e) { return false; }
    if (!j || typeof j !== 'object') return false;
    const m = g.msg;
    const s = g.stats;
    if (j.error) {
      m.error = 'Server error: ' + str(j.error.message || j.error);
      return false;
    }
    if (j.usage) {
      s.prompt_tokens = j.usage.prompt_tokens;
      s.completion_tokens = j.usage.completion_tokens;
      const d = j.usage.prompt_tokens_details;
      if (d && d.cached_tokens != null) s.cached_tokens = d.cached_tokens;
    }
    if (j.timings && typeof j.timings === 'object') {
      const t = j.timings;
      s.prompt_ms = t.prompt_ms;
      s.prompt_per_second = t.prompt_per_second;
      s.predicted_per_second = t.predicted_per_second;
      s.predicted_n = t.predicted_n;
      if (s.cached_tokens == null && t.cache_n != null) s.cached_tokens = t.cache_n;
    }
    let got = false;
    for (const ch of Array.isArray(j.choices) ? j.choices : []) {
      if (!ch || (ch.index || 0) !== 0) continue;
      const d = ch.delta || {};
      if (typeof d.reasoning_content === 'string' && d.reasoning_content) {
        m.reasoning += d.reasoning_content;
        got = true;
      }
      if (typeof d.content === 'string' && d.content) {
        m.content += d.content;
        got = true;
      }
      if (Array.isArray(d.tool_calls)) {
        for (const t of d.tool_calls) {
          if (!t || typeof t !== 'object') continue;
          const k = Number.isInteger(t.index) && t.index >= 0 && t.index < 128 ? t.index : m.tools.length;
          const slot = m.tools[k] || (m.tools[k] = { id: '', name: '', arguments: '' });
          if (t.id) slot.id = str(t.id);
          const f = t.function || {};
          slot.name += str(f.name);
          slot.arguments += str(f.arguments);
          got = true;
        }
      }
      if (ch.finish_reason) s.finish = str(ch.finish_reason);
    }
    if (got) {
      s.chunks = (s.chunks || 0) + 1;
      if (s.ttft_ms == null) s.ttft_ms = performance.now() - g.t0;
      schedule();
    }
    return false;
  }

  async function readStream(g, resp) {
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (onLine(g, line)) {
          reader.cancel().catch(() => {});
          return true;
        }
      }
    }
    return onLine(g, buf.trim());
  }

  async function send(text) {
    if (gen) return;
    let c = current();
    if (!c) c = newConv();
    c.messages.push({ role: 'user', content: text, reasoning: '', tools: [], stats: null, error: '', stopped: false });
    if (c.auto && c.messages.filter((m) => m.role === 'user').length === 1) c.title = titleOf(text);
    const msg = { role: 'assistant', content: '', reasoning: '', tools: [], stats: null, error: '', stopped: false };
    c.messages.push(msg);
    c.updated = Date.now();
    saveConvs();
    const g = {
      conv: c, msg, el: null, ctrl: new AbortController(), t0: 0, frame: 0, last: 0, saved: 0, stats: {},
    };
    gen = g;
    renderList();
    renderConversation();
    setBusy(true);
    const body = requestBody(c, c.messages.length - 1);
    g.t0 = performance.now();
    try {
      const resp = await fetch('v1/chat/completions', {
        method: 'POST', headers: authHeaders({ 'Content-Type': 'application/json' }),
        body: JSON.stringify(body), signal: g.ctrl.signal, cache: 'no-store',
      });
      if (!resp.ok) {
        msg.error = await errorOf(resp);
        if (resp.status === 401) {
          msg.error += ' — enter the API key above and send again.';
          askKey(apiKey ? 'The server rejected this key.' : '');
        }
      } else if (!(await readStream(g, resp)) && !msg.error) {
        msg.error = 'The connection closed before the answer was complete.';
      }
    } catch (e) {
      if (e && e.name === 'AbortError') msg.stopped = true;
      else msg.error = 'Network error: ' + (e && e.message ? e.message : e) + ' (is the server running?)';
    } finally {
      if (g.frame) cancelAnimationFrame(g.frame);
      g.stats.total_ms = performance.now() - g.t0;
      msg.stats = g.stats;
      gen = null;
      c.updated = Date.now();
      saveConvs();
      setBusy(false);
      paint(g);
      renderList();
    }
  }

  function stop() {
    if (gen) gen.ctrl.abort();
  }

  // ------------------------------------------------------------------ composer and keys

  const input = $('input');

  function autosize() {
    input.style.height = 'auto';
    input.style.height = Math.min(input.scrollHeight, Math.round(window.innerHeight * 0.4)) + 'px';
  }

  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = input.value.trim();
    if (!text || gen) return;
    input.value = '';
    autosize();
    send(text);
  });
  input.addEventListener('input', autosize);
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.ctrlKey && !e.altKey && !e.metaKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').addEventListener('click', () => { stop(); input.focus(); });
  document.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape') return;
    if (gen) { e.preventDefault(); stop(); return; }
    if (document.body.classList.contains('side-open')) { openSidebar(false); $('toggle-sidebar').focus(); }
    else if (!$('settings').hidden) { toggleSettings(false); $('toggle-settings').focus(); }
  });

  // Another tab changed the stored conversations: show them (unless this one is streaming).
  window.addEventListener('storage', (e) => {
    if (e.key !== KEYS.convs || gen) return;
    const v = load(KEYS.convs, []);
    convs = (Array.isArray(v) ? v : []).map(cleanConv).filter(Boolean);
    if (!current()) currentId = convs.length ? convs[0].id : '';
    renderList();
    renderConversation();
  });

  // ------------------------------------------------------------------ start

  if (!current()) {
    const recent = convs.slice().sort((a, b) => b.updated - a.updated)[0];
    currentId = recent ? recent.id : '';
  }
  fillSettings();
  renderList();
  renderConversation();
  setBusy(false);
  loadProps();
  if (!keyWanted) input.focus();
})();
