// The demo: a shared list that an assistant fills through the relay. The SDK part is the
// `connect` call and the element; the rest is the page's own list.
import { connect } from '/sdk/toolrelay.js';
import '/sdk/pairing.js';

const items = [];
let next = 1;
function show() {
  document.getElementById('list').replaceChildren(...items.map((item) => {
    const li = document.createElement('li');
    li.dataset.id = item.id;
    li.append(item.text, ' ', Object.assign(document.createElement('span'), { className: 'by', textContent: `(${item.by})` }));
    return li;
  }));
}
function add(text, by) {
  const item = { id: next++, text, by };
  items.push(item);
  show();
  return item;
}
document.getElementById('add').addEventListener('submit', (event) => {
  event.preventDefault();
  add(document.getElementById('text').value, 'you');
  event.target.reset();
});

// ---- the SDK: three tools, paired and shown ----
const relay = connect({
  tools: [
    { name: 'addItem', description: 'Adds an item to the list; returns it with its id.',
      inputSchema: { type: 'object', properties: { text: { type: 'string', minLength: 1 } }, required: ['text'] },
      execute: ({ text }) => add(text, 'assistant') },
    { name: 'listItems', description: 'The items on the list, oldest first.', readOnly: true,
      inputSchema: { type: 'object', properties: {} },
      execute: () => items },
    { name: 'removeItem', description: 'Removes the item with this id.', destructive: true,
      inputSchema: { type: 'object', properties: { id: { type: 'integer' } }, required: ['id'] },
      execute: ({ id }) => {
        const at = items.findIndex((item) => item.id === id);
        if (at < 0) throw new Error(`There is no item ${id}; listItems gives the ids.`);
        items.splice(at, 1);
        show();
        return { removed: id };
      } },
  ],
});
document.querySelector('toolrelay-pairing').connection = relay;

// For tests and curious developers.
window.demo = { relay, items };
