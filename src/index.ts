export { VERSION } from "./version.js";
