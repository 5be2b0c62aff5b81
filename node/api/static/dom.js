// DOM helpers shared by the dashboard's modules: everything is inserted as text, never as HTML.
"use strict";

export const $ = (id) => document.getElementById(id);

export function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

export function short(id) {
  return id ? String(id).slice(0, 6) + "…" + String(id).slice(-6) : "";
}

export function cell(row, value, cls) {
  const td = el("td", value, cls);
  row.appendChild(td);
  return td;
}

export function listCell(row, items) {
  const td = el("td");
  if (!items.length) {
    td.textContent = "—";
    td.className = "muted";
  } else {
    const ul = el("ul", null, "cell");
    for (const item of items) ul.appendChild(el("li", item));
    td.appendChild(ul);
  }
  row.appendChild(td);
  return td;
}

export function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren();
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", empty, "muted");
    td.colSpan = columns;
    tr.appendChild(td);
    tbody.appendChild(tr);
  }
  for (const row of rows) tbody.appendChild(row);
}

// a table with a header row; a row is an array of cell values (or [value, class] pairs), or
// {cells, data} where data becomes the row's data-* attributes
export function table(headers, rows, empty, id) {
  const t = el("table");
  if (id) t.id = id;
  const head = el("tr");
  for (const h of headers) head.appendChild(el("th", h));
  t.appendChild(el("thead")).appendChild(head);
  const body = el("tbody");
  fill(body, rows.map((row) => {
    const tr = el("tr");
    const values = Array.isArray(row) ? row : row.cells;
    Object.assign(tr.dataset, Array.isArray(row) ? {} : row.data);
    for (const v of values) {
      if (Array.isArray(v)) cell(tr, v[0], v[1]);
      else cell(tr, v);
    }
    return tr;
  }), empty, headers.length);
  t.appendChild(body);
  return t;
}

// a row of labelled figures: [[label, value], ...]
export function facts(pairs, cls) {
  const box = el("div", null, cls ? `facts ${cls}` : "facts");
  for (const [label, value] of pairs) {
    const fact = el("div", null, "fact");
    fact.dataset.fact = label;
    fact.appendChild(el("span", value, "value"));
    fact.appendChild(el("span", label, "label"));
    box.appendChild(fact);
  }
  return box;
}
