/**
 * Import rules of ARCHITECTURE.md, checked on every `import`/`export ... from` and `import()`
 * in src/**\/*.ts (parsed with the TypeScript compiler already used for the type check):
 *   (a) no cycle between folders,
 *   (b) a folder imports only what its row of the "Import rules" table allows (the table is
 *       read from ARCHITECTURE.md itself, so the document and the check cannot drift),
 *   (c) another folder is imported only through its index.ts (core excepted, see the document),
 *   (d) each external system's package is imported (for values) by its one adapter folder.
 * Known exceptions to (c) are listed below; the test fails when one of them is no longer
 * needed, so the list only shrinks.
 */
import t from 'tap';
import ts from 'typescript';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SRC = join(ROOT, 'src');
const ROOT_FILES = ['app.ts', 'main.ts'];

/**
 * (c) exceptions: `importer -> file` that bypass the folder's index.ts. The importer is a
 * folder (every file in it) or a root file.
 */
const INDEX_EXCEPTIONS: readonly string[] = [
  // The signal listeners, loaded before everything else (ARCHITECTURE.md "Through index.ts").
  'main.ts -> src/cli/signals.ts',
];

/** (d) packages that only their adapter folder may import for values (types are free). */
const ADAPTERS: Readonly<Record<string, string>> = {
  'better-sqlite3': 'store',
  'uWebSockets.js': 'http',
  systeminformation: 'gpu',
};

/** Files outside src/ that src may import: the schemas and the package manifest (JSON). */
const OUTSIDE_SRC = [/^schema\/[\w.-]+\.json$/, /^package\.json$/];

interface Edge {
  from: string;
  /** A relative import of a repository file (else a package or node: built-in). */
  local: boolean;
  fromUnit: string;
  /** Repo-relative file for local imports; the package name otherwise. */
  to: string;
  toUnit: string | null;
  typeOnly: boolean;
  line: number;
}

function listTs(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((d) => {
    const p = join(dir, d.name);
    if (d.isDirectory()) return listTs(p);
    return d.name.endsWith('.ts') && !d.name.endsWith('.d.ts') ? [p] : [];
  });
}

const rel = (p: string): string => relative(ROOT, p).split(sep).join('/');

/** `app.ts`, `main.ts`, or the folder right under src/. Null outside src. */
function unitOf(repoPath: string): string | null {
  if (!repoPath.startsWith('src/')) return null;
  const rest = repoPath.slice(4);
  return rest.includes('/') ? (rest.split('/')[0] as string) : rest;
}

function isTypeOnlyImport(node: ts.ImportDeclaration): boolean {
  const clause = node.importClause;
  if (!clause) return false;
  if (clause.isTypeOnly) return true;
  const named = clause.namedBindings;
  return !clause.name && named !== undefined && ts.isNamedImports(named) && named.elements.length > 0 && named.elements.every((e) => e.isTypeOnly);
}

function isTypeOnlyExport(node: ts.ExportDeclaration): boolean {
  if (node.isTypeOnly) return true;
  const clause = node.exportClause;
  return clause !== undefined && ts.isNamedExports(clause) && clause.elements.length > 0 && clause.elements.every((e) => e.isTypeOnly);
}

function edgesOf(file: string): Edge[] {
  const text = readFileSync(file, 'utf8');
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const from = rel(file);
  const fromUnit = unitOf(from) as string;
  const out: Edge[] = [];
  const add = (specifier: string, typeOnly: boolean, node: ts.Node): void => {
    const line = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line + 1;
    if (!specifier.startsWith('.')) {
      out.push({ from, fromUnit, local: false, to: specifier, toUnit: null, typeOnly, line });
      return;
    }
    let target = resolve(dirname(file), specifier);
    if (target.endsWith('.js') && existsSync(target.slice(0, -3) + '.ts')) target = target.slice(0, -3) + '.ts';
    const to = rel(target);
    out.push({ from, fromUnit, local: true, to, toUnit: unitOf(to), typeOnly, line });
  };
  const visit = (node: ts.Node): void => {
    if (ts.isImportDeclaration(node) && ts.isStringLiteral(node.moduleSpecifier)) {
      add(node.moduleSpecifier.text, isTypeOnlyImport(node), node);
    } else if (ts.isExportDeclaration(node) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
      add(node.moduleSpecifier.text, isTypeOnlyExport(node), node);
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference) && ts.isStringLiteral(node.moduleReference.expression)) {
      add(node.moduleReference.expression.text, node.isTypeOnly, node);
    } else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword) {
      const [arg] = node.arguments;
      if (arg && ts.isStringLiteralLike(arg)) add(arg.text, false, node);
    } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument) && ts.isStringLiteral(node.argument.literal)) {
      add(node.argument.literal.text, true, node);
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out;
}

interface Rule {
  /** Units whose values (and types) may be imported; '*' for all. */
  values: Set<string>;
  /** Units whose types only may be imported, in addition. */
  types: Set<string>;
}

/** Backticked names of a table cell; remarks in parentheses are prose, not rules. */
function unitsIn(cell: string): Set<string> {
  const text = cell.replace(/\([^)]*\)/g, '');
  const out = new Set<string>();
  if (/\beverything\b/.test(text)) out.add('*');
  for (const tok of text.matchAll(/`([^`]+)`/g)) out.add((tok[1] as string).replace(/\/$/, ''));
  return out;
}

/** The "Import rules" table of ARCHITECTURE.md, one rule per folder or root file. */
function readRules(): Map<string, Rule> {
  const doc = readFileSync(join(ROOT, 'ARCHITECTURE.md'), 'utf8');
  const m = /<!-- import-rules:start -->([\s\S]*?)<!-- import-rules:end -->/.exec(doc);
  if (!m) throw new Error('ARCHITECTURE.md has no <!-- import-rules:start --> ... <!-- import-rules:end --> table');
  const rules = new Map<string, Rule>();
  for (const row of (m[1] as string).split('\n')) {
    const cells = row.split('|').map((c) => c.trim());
    if (cells.length < 5 || !/^`[^`]+`$/.test(cells[1] as string)) continue;
    rules.set((cells[1] as string).slice(1, -1).replace(/\/$/, ''), { values: unitsIn(cells[2] as string), types: unitsIn(cells[3] as string) });
  }
  return rules;
}

const files = listTs(SRC);
const edges = files.flatMap(edgesOf);
const rules = readRules();
const units = new Set(files.map((f) => unitOf(rel(f)) as string));

t.test('the parser sees the imports', async (t) => {
  t.ok(files.length > 10, `${files.length} source files`);
  t.ok(edges.some((e) => e.from === 'src/main.ts' && e.to === 'src/cli/index.ts'), 'main.ts -> cli/index.ts found');
  t.ok(edges.some((e) => e.to === 'better-sqlite3' && e.fromUnit === 'store' && !e.typeOnly), 'a value import of a package is found');
  t.ok(edges.some((e) => e.typeOnly), 'type-only imports are told apart');
});

t.test('every folder under src/ has a row in the import rules table', async (t) => {
  for (const u of units) t.ok(rules.has(u), `${u} is in ARCHITECTURE.md's import rules table`);
  for (const [u, rule] of rules) {
    for (const a of [...rule.values, ...rule.types]) t.ok(a === '*' || rules.has(a), `${u}: "${a}" is a known folder or file`);
  }
});

t.test('(a) no cycle between folders', async (t) => {
  const graph = new Map<string, Set<string>>();
  for (const e of edges) {
    if (e.toUnit === null || e.toUnit === e.fromUnit || !units.has(e.toUnit)) continue;
    let next = graph.get(e.fromUnit);
    if (!next) graph.set(e.fromUnit, (next = new Set()));
    next.add(e.toUnit);
  }
  // Tarjan's strongly connected components: any component of two or more folders is a cycle.
  let index = 0;
  const idx = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const cycles: string[][] = [];
  const connect = (v: string): void => {
    idx.set(v, index);
    low.set(v, index++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!idx.has(w)) {
        connect(w);
        low.set(v, Math.min(low.get(v) as number, low.get(w) as number));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v) as number, idx.get(w) as number));
      }
    }
    if (low.get(v) === idx.get(v)) {
      const scc: string[] = [];
      let w: string;
      do {
        w = stack.pop() as string;
        onStack.delete(w);
        scc.push(w);
      } while (w !== v);
      if (scc.length > 1) cycles.push(scc.sort());
    }
  };
  for (const v of units) if (!idx.has(v)) connect(v);
  for (const scc of cycles) {
    // One concrete loop through the component (breadth-first back to its first folder), with
    // one import per hop as evidence.
    const start = scc[0] as string;
    const prev = new Map<string, string>();
    const queue = [start];
    let last: string | undefined;
    while (queue.length && last === undefined) {
      const v = queue.shift() as string;
      for (const w of graph.get(v) ?? []) {
        if (!scc.includes(w)) continue;
        if (w === start) {
          last = v;
          break;
        }
        if (!prev.has(w)) {
          prev.set(w, v);
          queue.push(w);
        }
      }
    }
    const loop = [start];
    for (let v = last as string; v !== start; v = prev.get(v) as string) loop.splice(1, 0, v);
    loop.push(start);
    const hops = loop.slice(1).map((to, i) => {
      const e = edges.find((x) => x.fromUnit === loop[i] && x.toUnit === to) as Edge;
      return `  ${e.from}:${e.line} -> ${e.to}`;
    });
    t.fail(`cycle ${loop.join(' -> ')} (folders in the cycle: ${scc.join(', ')}):\n${hops.join('\n')}`);
  }
  t.equal(cycles.length, 0, 'no cycles');
});

t.test('(b) each folder imports only what the table allows', async (t) => {
  const bad: string[] = [];
  for (const e of edges) {
    if (!e.local) continue;
    if (e.toUnit === null) {
      if (!OUTSIDE_SRC.some((re) => re.test(e.to))) bad.push(`${e.from}:${e.line} imports ${e.to}, outside src/ (only schema/*.json and package.json may be)`);
      continue;
    }
    if (e.toUnit === e.fromUnit) continue;
    const rule = rules.get(e.fromUnit);
    if (!rule || rule.values.has('*') || rule.values.has(e.toUnit)) continue;
    if (e.typeOnly && rule.types.has(e.toUnit)) continue;
    const types = rule.types.size ? `; types also from ${[...rule.types].join(', ')}` : '';
    bad.push(`${e.from}:${e.line} imports ${e.to}${e.typeOnly ? ' (types)' : ''}: ${e.fromUnit} may import only ${[...rule.values].join(', ') || 'nothing of ours'}${types}`);
  }
  t.same(bad, [], 'no import breaks the table in ARCHITECTURE.md');
});

t.test('app.ts is imported only by cli/serve.ts and main.ts', async (t) => {
  const importers = [...new Set(edges.filter((e) => e.to === 'src/app.ts').map((e) => e.from))].sort();
  t.same(importers.filter((f) => f !== 'src/cli/serve.ts' && f !== 'src/main.ts'), []);
});

t.test('(c) other folders are imported through their index.ts', async (t) => {
  const used = new Set<string>();
  const bad: string[] = [];
  for (const e of edges) {
    if (e.toUnit === null || e.toUnit === e.fromUnit || ROOT_FILES.includes(e.toUnit)) continue;
    // core is a kit of independent modules (errors, logger, schemas, native loader); a barrel
    // would make importing AgentError also compile every schema and load the native addons.
    if (e.toUnit === 'core') continue;
    if (e.to === `src/${e.toUnit}/index.ts`) continue;
    const key = `${e.fromUnit} -> ${e.to}`;
    if (INDEX_EXCEPTIONS.includes(key)) {
      used.add(key);
      continue;
    }
    bad.push(`${e.from}:${e.line} imports ${e.to}; import src/${e.toUnit}/index.ts instead`);
  }
  t.same(bad, [], 'no deep imports into another folder');
  for (const x of INDEX_EXCEPTIONS) t.ok(used.has(x), `exception "${x}" is still needed (remove it from the list once fixed)`);
});

t.test('(d) external systems are reached through their one adapter folder', async (t) => {
  const bad = edges
    .filter((e) => !e.local && !e.typeOnly)
    .filter((e) => {
      const pkg = Object.keys(ADAPTERS).find((p) => e.to === p || e.to.startsWith(`${p}/`));
      return pkg !== undefined && e.fromUnit !== ADAPTERS[pkg];
    })
    .map((e) => `${e.from}:${e.line} imports ${e.to}; only ${ADAPTERS[e.to.split('/')[0] as string] ?? '?'}/ may`);
  t.same(bad, []);
});
