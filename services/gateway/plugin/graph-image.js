// A graph as the assistant gets it: CODAP's picture of it (`get dataDisplay[graph]`, a PNG
// data URI of the graph's size) as an image item it can look at — at most MAX_WIDTH pixels
// wide, drawn smaller on a canvas when CODAP's is wider, aspect kept — and a sentence on what
// it shows, from the graph's own description (`get component[graph]`: its plot type and
// attributes) and its data set ("Scatter plot of height against age, 31 cases (PNG 640×480)").
// What CODAP cannot tell (an older CODAP has no plotType) is left out of the sentence; only the
// picture itself is needed.

import { ToolError } from '../sdk/dispatcher.js';
import { ToolResult, splitDataUri } from '../sdk/result.js';
import { CodapErrorCode } from './codap.js';

// Wider than this is more than an assistant's vision needs, and costs the answer's budget.
export const MAX_WIDTH = 1024;
// Base64 characters an image may take: room for it in the relay's 1 MB answer. A wider one is
// drawn smaller until it fits (not below MIN_WIDTH).
export const MAX_BASE64 = 700000;
const MIN_WIDTH = 256;

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

// CODAP v3's plot types (graph-types.ts PlotTypes), in words.
const PLOTS = Object.freeze({
  casePlot: 'Case plot',
  dotChart: 'Dot chart',
  barChart: 'Bar chart',
  dotPlot: 'Dot plot',
  binnedDotPlot: 'Binned dot plot',
  histogram: 'Histogram',
  linePlot: 'Line plot',
  scatterPlot: 'Scatter plot',
});

/** The first `count` bytes of base64 `data`. */
export function leadingBytes(data, count) {
  const binary = atob(data.slice(0, Math.ceil(count / 3) * 4));
  return Uint8Array.from(binary.slice(0, count), (char) => char.charCodeAt(0));
}

/** A PNG's `{width, height}` from its header (IHDR), or null when `bytes` are no PNG. */
export function pngSize(bytes) {
  if (bytes.length < 24 || PNG_SIGNATURE.some((byte, at) => bytes[at] !== byte)) return null;
  if (String.fromCharCode(...bytes.subarray(12, 16)) !== 'IHDR') return null;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return { width: view.getUint32(16), height: view.getUint32(20) };
}

/** The size to draw a `width`×`height` picture at: at most `maxWidth` wide, aspect kept. */
export function fitted({ width, height }, maxWidth = MAX_WIDTH) {
  if (width <= maxWidth) return { width, height };
  return { width: maxWidth, height: Math.max(1, Math.round((height * maxWidth) / width)) };
}

/**
 * A sentence on what graph `graph` (CODAP's description of it, or null) shows, with the count
 * of its cases and the picture's size: "Scatter plot of height against age, coloured by sex,
 * 31 cases (PNG 640×480, scaled down from 1600×1200)".
 */
export function describeGraph(graph, { cases, width, height, original } = {}) {
  const g = graph ?? {};
  const named = (value) => (typeof value === 'string' && value ? value : null);
  const x = named(g.xAttributeName);
  const y = named(g.yAttributeName);
  const legend = named(g.legendAttributeName);
  let words = PLOTS[g.plotType] ?? 'Graph';
  if (x && y) words += ` of ${y} against ${x}`;
  else if (x || y) words += ` of ${x ?? y}`;
  if (legend) words += `, coloured by ${legend}`;
  if (Number.isInteger(cases)) words += `, ${cases} case${cases === 1 ? '' : 's'}`;
  const title = named(g.title);
  if (title && title !== 'Graph') words = `${title}: ${words}`;
  let size = `PNG ${width}×${height}`;
  if (original && (original.width !== width || original.height !== height)) size += `, scaled down from ${original.width}×${original.height}`;
  return `${words} (${size})`;
}

/** The case count a graph plots: its data set's deepest collection holding one of its attributes. */
async function casesOf(ask, graph) {
  if (!graph?.dataContext) return undefined;
  const context = await ask('get', `dataContext[${graph.dataContext}]`);
  const collections = Array.isArray(context?.collections) ? context.collections : [];
  if (!collections.length) return undefined;
  const names = new Set(['xAttributeName', 'yAttributeName', 'y2AttributeName', 'legendAttributeName'].map((key) => graph[key]).filter(Boolean));
  let deepest = -1;
  collections.forEach((collection, at) => {
    if ((collection.attrs ?? []).some((attribute) => names.has(attribute.name))) deepest = at;
  });
  const collection = collections[deepest < 0 ? collections.length - 1 : deepest];
  const count = await ask('get', `dataContext[${graph.dataContext}].collection[${collection.name}].caseCount`);
  if (!Number.isInteger(count)) return undefined;
  const hidden = Array.isArray(graph.hiddenCases) ? graph.hiddenCases.length : 0;
  return Math.max(0, count - hidden);
}

/** A picture (a data URI) decoded: an <img> with its natural size. */
async function decoded(dataUri) {
  const image = new Image();
  image.src = dataUri;
  await image.decode();
  return image;
}

/** `image` drawn at `size` as a PNG, base64. */
function drawn(image, size) {
  const canvas = document.createElement('canvas');
  canvas.width = size.width;
  canvas.height = size.height;
  const context = canvas.getContext('2d');
  context.imageSmoothingQuality = 'high';
  context.drawImage(image, 0, 0, size.width, size.height);
  return splitDataUri(canvas.toDataURL('image/png')).data;
}

/**
 * CODAP's picture (a data URI) as a PNG an assistant gets: as it is when it is a PNG at most
 * MAX_WIDTH wide that fits MAX_BASE64, else drawn smaller. Resolves with `{data, width,
 * height, original: {width, height}}`.
 */
export async function fittedPng(dataUri) {
  const { mimeType, data } = splitDataUri(dataUri);
  const header = mimeType === 'image/png' ? pngSize(leadingBytes(data, 24)) : null;
  if (header && header.width <= MAX_WIDTH && data.length <= MAX_BASE64) return { data, ...header, original: header };
  const image = await decoded(dataUri);
  const original = { width: image.naturalWidth, height: image.naturalHeight };
  let size = fitted(original);
  let png = drawn(image, size);
  while (png.length > MAX_BASE64 && size.width > MIN_WIDTH) {
    size = fitted(size, Math.max(MIN_WIDTH, Math.floor(size.width * 0.75)));
    png = drawn(image, size);
  }
  if (png.length > MAX_BASE64) throw new ToolError(CodapErrorCode.ERROR, 'The graph\'s picture is too large to send, even drawn small.');
  return { data: png, ...size, original };
}

/**
 * Graph `graph` (an id or a name) as an image and a sentence, asking CODAP through `ask(action,
 * resource)` (which throws CODAP's refusal). Fails with CODAP's message when it gives no picture.
 */
export async function graphImage(ask, graph) {
  const values = await ask('get', `dataDisplay[${graph}]`);
  const uri = values?.exportDataUri;
  if (typeof uri !== 'string' || !uri.startsWith('data:image/')) {
    throw new ToolError(CodapErrorCode.ERROR, String(values?.error || `CODAP gave no picture of ${graph}: is it a graph?`));
  }
  const png = await fittedPng(uri);
  // The words are a courtesy: a CODAP that cannot say them still gives the picture.
  const component = await ask('get', `component[${graph}]`).catch(() => null);
  const cases = await casesOf(ask, component).catch(() => undefined);
  const text = describeGraph(component, { cases, width: png.width, height: png.height, original: png.original });
  const structured = Object.fromEntries(
    Object.entries({
      graph: component?.id ?? graph,
      title: component?.title,
      plotType: component?.plotType,
      xAttribute: component?.xAttributeName,
      yAttribute: component?.yAttributeName,
      legendAttribute: component?.legendAttributeName,
      cases,
      mimeType: 'image/png',
      width: png.width,
      height: png.height,
      originalWidth: png.original.width,
      originalHeight: png.original.height,
    }).filter(([, value]) => value !== undefined && value !== null && value !== ''),
  );
  return ToolResult.image(png.data, 'image/png').and(ToolResult.text(text)).with({ structuredContent: structured });
}
