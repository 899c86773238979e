/**
 * Effects under kills on replicated (a real three-member etcd cluster): a real `cairn run` SIGKILLed
 * at every boundary of each of three effects, resumed, the model running the cell again; every
 * effect performed once (see chaos/support/effect-kill.ts).
 */
import { effectKillSuite } from "./support/effect-kill.js";

effectKillSuite("replicated");
