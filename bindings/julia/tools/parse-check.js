#!/usr/bin/env node
// Parses Julia files with tree-sitter-julia (WASM, through web-tree-sitter) and fails on any ERROR or
// MISSING node, printing file:line:column. It catches syntax that the old Julia on CI would accept
// but a current parser rejects (and typos in files the tests never load).
//
//   NODE_PATH=<dir with node_modules> node parse-check.js FILE.jl...
//
// Exit status: 0 all files parse, 1 a syntax error was found, 2 usage or setup problem.
'use strict';

const fs = require('fs');

// First problem nodes in document order; a broken file reports its first few, not hundreds.
function problems(node, out, limit) {
  if (out.length >= limit) return;
  if (node.isError || node.type === 'ERROR') {
    out.push({ node, what: 'syntax error' });
  } else if (node.isMissing) {
    out.push({ node, what: `missing ${node.type}` });
  }
  if (!node.hasError && !node.isMissing) return; // no problem below a clean subtree
  for (let i = 0; i < node.childCount; i++) problems(node.child(i), out, limit);
}

async function main(files) {
  if (files.length === 0) {
    console.error('usage: parse-check.js FILE.jl...');
    return 2;
  }
  let Parser, Language;
  try {
    ({ Parser, Language } = require('web-tree-sitter'));
  } catch (e) {
    console.error(`parse-check: web-tree-sitter not found (NODE_PATH=${process.env.NODE_PATH || ''})`);
    return 2;
  }
  await Parser.init();
  const julia = await Language.load(require.resolve('tree-sitter-julia/tree-sitter-julia.wasm'));
  const parser = new Parser();
  parser.setLanguage(julia);

  let bad = 0;
  for (const file of files) {
    const tree = parser.parse(fs.readFileSync(file, 'utf8'));
    const found = [];
    problems(tree.rootNode, found, 5);
    for (const { node, what } of found) {
      const p = node.startPosition; // 0-based row and column
      const text = node.text.split('\n')[0].slice(0, 60);
      console.error(`${file}:${p.row + 1}:${p.column + 1}: ${what}${text ? `: ${text}` : ''}`);
    }
    if (found.length > 0) bad++;
    tree.delete();
  }
  console.log(`parse-check: ${files.length - bad} of ${files.length} Julia files parse cleanly`);
  return bad === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`parse-check: ${err && err.stack ? err.stack : err}`);
    process.exit(2);
  },
);
